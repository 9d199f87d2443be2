#!/usr/bin/env bash
# Mesa 25's lavapipe (software Vulkan) for Dawn, unpacked beside the system's driver, never installed over it:
# Dawn rejects Debian 12's Mesa 22 lavapipe, while wgpu-native's test passes keep running on the system driver.
# Prints the environment that selects it (VK_DRIVER_FILES, LD_LIBRARY_PATH); prints nothing where it cannot be had
# (not Debian 12, not root, no apt). Usage: eval "$(scripts/mesa-backports.sh DIR)"
set -euo pipefail
dir=${1:?usage: mesa-backports.sh DIR}
emit() {
  echo "export VK_DRIVER_FILES=$dir/lvp.json"
  echo "export LD_LIBRARY_PATH=$dir/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
if [ -f "$dir/lvp.json" ]; then emit; exit 0; fi
command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] || exit 0
grep -qs 'VERSION_CODENAME=bookworm' /etc/os-release || exit 0
# The machine's own Debian mirror, from its apt sources (deb822 or one-line format).
mirror=$(grep -hoE '(URIs:|^deb) +[^ ]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null \
  | awk '{print $2}' | grep -v security | head -1 || true)
[ -n "$mirror" ] || exit 0
list=/etc/apt/sources.list.d/ember-bookworm-backports.list
if [ ! -f "$list" ]; then
  # Backports are pinned below the release by default: nothing else on the machine upgrades from them.
  echo "deb $mirror bookworm-backports main" > "$list"
fi
apt-get update -qq >&2
debs=$(mktemp -d)
# The debs that installing backports' mesa-vulkan-drivers would bring (the driver, and the newer libraries it needs).
apt-get install -y -qq --download-only -o Dir::Cache::archives="$debs" -t bookworm-backports \
  mesa-vulkan-drivers >&2
mkdir -p "$dir"
for deb in "$debs"/*.deb; do dpkg -x "$deb" "$dir"; done
rm -rf "$debs"
icd=$(ls "$dir"/usr/share/vulkan/icd.d/lvp_icd*.json 2>/dev/null | head -1 || true)
[ -n "$icd" ] || { echo "mesa-backports: no lavapipe in the backports packages" >&2; exit 0; }
sed -E "s#\"library_path\": *\"([^\"]*/)?([^\"/]+)\"#\"library_path\": \"$dir/usr/lib/x86_64-linux-gnu/\\2\"#" "$icd" \
  > "$dir/lvp.json"
emit
