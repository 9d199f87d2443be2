"""OrtValue and IOBinding for ember's ONNX Runtime API: ORT's device-resident values are ember DeviceArrays on the
wgpu backend (device "webgpu"); values on the host are numpy arrays (device "cpu")."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from .device_array import DeviceArray
from .model import shared_backend
from .session_types import Fail, InvalidArgument, OrtNotImplemented

if TYPE_CHECKING:
    from .session import InferenceSession

# The device types ember has memory on; ORT's "gpu" is its generic name for the same device.
DEVICE_TYPES = {"cpu": "cpu", "webgpu": "webgpu", "gpu": "webgpu"}


def device_kind(device_type: str) -> str:
    """"cpu" or "webgpu" for a device type string (ValueError naming the valid ones for any other)."""
    kind = DEVICE_TYPES.get(str(device_type).lower())
    if kind is None:
        raise ValueError(f"Unsupported device type: {device_type!r}; ember has memory on {sorted(DEVICE_TYPES)} "
                         "('gpu' and 'webgpu' are the wgpu backend's device)")
    return kind


def element_dtype(element_type: Any) -> np.dtype:
    """A numpy dtype from a numpy type or an ONNX TensorProto element type (int)."""
    if isinstance(element_type, int) and not isinstance(element_type, bool):
        return np.dtype(helper.tensor_dtype_to_np_dtype(element_type))
    return np.dtype(element_type)


def host_view(buffer_ptr: int, dtype: np.dtype, shape: Sequence[int]) -> np.ndarray:
    """A numpy array over caller-owned host memory (ORT's raw-pointer binding): the caller keeps it alive."""
    nbytes = math.prod(shape) * dtype.itemsize
    raw = (ctypes.c_char * nbytes).from_address(int(buffer_ptr))
    return np.frombuffer(raw, dtype=dtype).reshape(tuple(shape))


class OrtValue:
    """ORT's OrtValue over an ember value: a numpy array (device "cpu") or a DeviceArray on the wgpu backend
    (device "webgpu", fed to a wgpu session without a host round trip)."""

    def __init__(self, value: np.ndarray | DeviceArray) -> None:
        if not isinstance(value, (np.ndarray, DeviceArray)):
            raise TypeError(f"OrtValue holds a numpy array or an ember DeviceArray, got {type(value).__name__}; use "
                            "OrtValue.ortvalue_from_numpy")
        self._value = value

    @classmethod
    def ortvalue_from_numpy(cls, numpy_obj: np.ndarray, /, device_type: str = "cpu", device_id: int = 0,
                            vendor_id: int = -1) -> OrtValue:
        """A value from a numpy array: on "cpu" it shares the array's memory (as in ORT); on "webgpu"/"gpu" it is
        uploaded to the wgpu backend (device_id picks the adapter; 0: the one sessions use by default)."""
        if device_kind(device_type) == "cpu":
            return cls(np.asarray(numpy_obj))
        return cls(DeviceArray.from_numpy(_wgpu(device_id), np.asarray(numpy_obj)))

    @classmethod
    def ortvalue_from_shape_and_type(cls, shape: Sequence[int], element_type: Any = np.float32,
                                     device_type: str = "cpu", device_id: int = 0, vendor_id: int = -1) -> OrtValue:
        """A zero-filled value of this shape and element type (numpy type or ONNX element type) on the device."""
        return cls.ortvalue_from_numpy(np.zeros(tuple(shape), element_dtype(element_type)), device_type, device_id)

    @property
    def device_array(self) -> DeviceArray | None:
        """The ember DeviceArray behind a device value (None for a host value)."""
        return self._value if isinstance(self._value, DeviceArray) else None

    def data_ptr(self) -> int:
        """The host address of a "cpu" value's first element; device buffers expose no pointer (as ORT's WebGPU)."""
        if isinstance(self._value, DeviceArray):
            raise Fail("data_ptr: a webgpu value's buffer is a device handle with no host address; read it with "
                       ".numpy()")
        return int(self._value.ctypes.data)

    def device_name(self) -> str:
        """"cpu" or "webgpu"."""
        if isinstance(self._value, DeviceArray) and self._value.backend.name == "wgpu":
            return "webgpu"
        return "cpu"

    def shape(self) -> list[int]:
        """The shape, as a list (ORT's type)."""
        return list(self._value.shape)

    def data_type(self) -> str:
        """The type string, e.g. "tensor(float)"."""
        return f"tensor({onnx.TensorProto.DataType.Name(self.element_type()).lower()})"

    def element_type(self) -> int:
        """The ONNX TensorProto element type."""
        return int(helper.np_dtype_to_tensor_dtype(self._value.dtype))

    def tensor_size_in_bytes(self) -> int:
        """Bytes of the tensor's elements."""
        return math.prod(self._value.shape) * self._value.dtype.itemsize

    def has_value(self) -> bool:
        """True: ember's values are never empty optionals."""
        return True

    def is_tensor(self) -> bool:
        """True: ember's values are dense tensors."""
        return True

    def is_sparse_tensor(self) -> bool:
        """False: ember has no sparse tensors."""
        return False

    def is_tensor_sequence(self) -> bool:
        """False: ember's values are tensors."""
        return False

    def numpy(self) -> np.ndarray:
        """The values on the host (a device value is read back; ORT would ask for copy_outputs_to_cpu)."""
        return self._value.numpy() if isinstance(self._value, DeviceArray) else self._value

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def update_inplace(self, data: np.ndarray | OrtValue) -> None:
        """Overwrite the values with `data` of the same shape and dtype, in place (a device value on the
        device)."""
        arr = data.numpy() if isinstance(data, OrtValue) else data
        if not isinstance(arr, np.ndarray):
            raise TypeError("data must be a numpy.ndarray or an OrtValue.")
        if arr.shape != tuple(self._value.shape) or arr.dtype != self._value.dtype:
            raise InvalidArgument(f"update_inplace: expected {self._value.dtype}{list(self._value.shape)}, got "
                                  f"{arr.dtype}{list(arr.shape)}")
        if isinstance(self._value, DeviceArray):
            if arr.size:
                self._value.backend.upload(self._value.handle, np.ascontiguousarray(arr))
        else:
            np.copyto(self._value, arr)

    def __repr__(self) -> str:
        return f"OrtValue({self.data_type()}, shape={self.shape()}, device={self.device_name()!r})"


def _wgpu(device_id: int) -> Any:
    # Device 0 is the backend a session without provider options loads onto, so values move without a copy.
    return shared_backend("wgpu") if not device_id else shared_backend("wgpu", adapter=int(device_id))


def _deliver(name: str, value: Any, target: np.ndarray | OrtValue | None) -> OrtValue:
    """The output as an OrtValue, written into the caller's buffer or OrtValue where one was bound."""
    if target is None:
        return OrtValue(value)
    host = isinstance(target, np.ndarray) or target.device_array is None
    if host:
        buf = target if isinstance(target, np.ndarray) else target._value
        arr = value.numpy() if isinstance(value, DeviceArray) else value
        if buf.shape != arr.shape or buf.dtype != arr.dtype:
            raise InvalidArgument(f"output {name!r}: the bound buffer is {buf.dtype}{list(buf.shape)}, the output "
                                  f"is {arr.dtype}{list(arr.shape)}")
        np.copyto(buf, arr)
        return target if isinstance(target, OrtValue) else OrtValue(buf)
    # A bound device OrtValue takes the run's device array: ember's outputs are fresh buffers, so this hands the
    # result over without a device copy (an array taken from the OrtValue before the run keeps the old values).
    target._value = value if isinstance(value, DeviceArray) else DeviceArray.from_numpy(target._value.backend, value)
    return target


class IOBinding:
    """ORT's IOBinding: inputs bound from host arrays, host pointers or OrtValues; outputs bound to the host, to
    the device (kept there as DeviceArrays), to a host pointer or to an OrtValue. Run it with
    session.run_with_iobinding(binding)."""

    def __init__(self, session: InferenceSession) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: dict[str, tuple[str, np.ndarray | OrtValue | None]] = {}
        self._results: list[OrtValue] = []

    def bind_cpu_input(self, name: str, arr_on_cpu: Any) -> None:
        """Bind an input to a host array (its memory is read at run time, as in ORT)."""
        self._inputs[name] = arr_on_cpu

    def bind_input(self, name: str, device_type: str, device_id: int, element_type: Any, shape: Sequence[int],
                   buffer_ptr: int) -> None:
        """Bind an input to raw memory: host memory ("cpu") only, since ember's device buffers have no raw
        address; bind a device value with bind_ortvalue_input(OrtValue.ortvalue_from_numpy(a, "webgpu"))."""
        if device_kind(device_type) != "cpu":
            raise OrtNotImplemented("bind_input with a device pointer: ember's device buffers have no raw address; "
                                    "use bind_ortvalue_input with OrtValue.ortvalue_from_numpy(array, 'webgpu')")
        self._inputs[name] = host_view(buffer_ptr, element_dtype(element_type), shape)

    def bind_ortvalue_input(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an input to an OrtValue (a device one feeds a wgpu session without a host round trip)."""
        if not isinstance(ortvalue, OrtValue):
            raise TypeError(f"bind_ortvalue_input: expected an OrtValue, got {type(ortvalue).__name__}")
        self._inputs[name] = ortvalue

    def bind_output(self, name: str, device_type: str = "cpu", device_id: int = 0, element_type: Any = None,
                    shape: Sequence[int] | None = None, buffer_ptr: int | None = None) -> None:
        """Bind an output to a device: "cpu" (read back; written into `buffer_ptr` if given) or "webgpu"/"gpu"
        (left on the device as a DeviceArray; only for a wgpu session)."""
        kind = device_kind(device_type)
        target = None
        if buffer_ptr is not None:
            if element_type is None or shape is None:
                raise ValueError("`element_type` and `shape` are to be provided if pre-allocated memory is provided")
            if kind != "cpu":
                raise OrtNotImplemented("bind_output with a device pointer: ember's device buffers have no raw "
                                        "address; bind_output(name, 'webgpu') keeps the output on the device")
            target = host_view(buffer_ptr, element_dtype(element_type), shape)
        self._outputs[name] = (kind, target)

    def bind_ortvalue_output(self, name: str, ortvalue: OrtValue) -> None:
        """Bind an output to an OrtValue: a host one is written in place (shape and dtype must match); a device
        one receives the run's device array."""
        if not isinstance(ortvalue, OrtValue):
            raise TypeError(f"bind_ortvalue_output: expected an OrtValue, got {type(ortvalue).__name__}")
        self._outputs[name] = (ortvalue.device_name(), ortvalue)

    def synchronize_inputs(self) -> None:
        """Nothing to wait for: ember writes inputs when the run is submitted."""

    def synchronize_outputs(self) -> None:
        """Nothing to wait for: run_with_iobinding returns once the outputs are written."""

    def get_outputs(self) -> list[OrtValue]:
        """The bound outputs of the last run, in binding order."""
        return list(self._results)

    def get_outputs_as_ortvaluevector(self) -> list[OrtValue]:
        """The same as get_outputs (ember has no separate vector type)."""
        return self.get_outputs()

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        """The last run's bound outputs as host arrays."""
        return [v.numpy() for v in self._results]

    def clear_binding_inputs(self) -> None:
        """Forget the bound inputs."""
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        """Forget the bound outputs (and the last run's results)."""
        self._outputs.clear()
        self._results = []

    def _run(self) -> None:
        """One run of the session with the bound values (session.run_with_iobinding calls this)."""
        if not self._outputs:
            raise Fail("Error in execution: At least one output should be requested.")
        on_device = [n for n, (kind, _) in self._outputs.items() if kind == "webgpu"]
        if on_device and self._session.backend != "wgpu":
            raise Fail(f"output(s) {on_device} are bound to the webgpu device, but this session runs on "
                       f"{self._session.get_providers()[0]}; bind them to 'cpu'")
        names = list(self._outputs)
        result = self._session._execute(self._inputs, names, keep_on_device=bool(on_device))
        # A run keeps every output on the device or none: host-bound ones are read back here.
        self._results = [_deliver(n, result[n].numpy() if kind == "cpu" and isinstance(result[n], DeviceArray)
                                  else result[n], target) for n, (kind, target) in self._outputs.items()]
