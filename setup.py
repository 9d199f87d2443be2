"""The one compiled piece: the cpu backend's GEMM over weights packed at load (src/ember/backends/cpu/_gemm.c) and
its small-row kernels (_rows.c: norms, decode attention, GELU), one library.

Optional: where it does not build (no C compiler), ember installs without it and numpy runs those products.
Everything else is configured in pyproject.toml.
"""

import os

from setuptools import Extension, setup

setup(ext_modules=[Extension("ember.backends.cpu._gemm", ["src/ember/backends/cpu/_gemm.c",
                                                          "src/ember/backends/cpu/_rows.c"], optional=True,
                             extra_compile_args=[] if os.name == "nt" else ["-O3"])])
