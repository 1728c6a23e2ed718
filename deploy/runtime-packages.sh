#!/usr/bin/env bash
# Prints the Debian runtime packages that provide the shared libraries the given ELF
# files link directly (their DT_NEEDED entries), one per line, sorted. apt pulls in
# the rest of the closure. Used by deploy/Dockerfile so the runtime image installs
# exactly what the built binaries need, even as dependencies change.
#   deploy/runtime-packages.sh build/bin/echokv-server build/bin/libechokv_spm_shim.so
set -euo pipefail
if (($# == 0)); then
  echo "usage: $0 ELF_FILE..." >&2
  exit 2
fi
for elf in "$@"; do
  [[ -f "$elf" ]] || { echo "runtime-packages: no such file: $elf" >&2; exit 1; }
  ldd_out="$(ldd "$elf")"
  while read -r soname; do
    path="$(awk -v s="$soname" '$1 == s && $2 == "=>" {print $3}' <<<"$ldd_out")"
    if [[ -z "$path" || "$path" == "not" ]]; then
      # Libraries of the build itself (none today) or the dynamic loader.
      echo "runtime-packages: $elf needs $soname, which ldd cannot resolve" >&2
      exit 1
    fi
    real="$(readlink -f "$path")"
    # Debian bookworm is merged-/usr: dpkg may record /lib/... or /usr/lib/...
    pkg=""
    for candidate in "$path" "$real" "${real#/usr}" "/usr${real#/usr}"; do
      pkg="$(dpkg -S "$candidate" 2>/dev/null | head -n1 | cut -d: -f1)" && [[ -n "$pkg" ]] && break
    done
    if [[ -z "$pkg" ]]; then
      echo "runtime-packages: no Debian package owns $soname ($real)" >&2
      exit 1
    fi
    echo "$pkg"
  done < <(objdump -p "$elf" | awk '$1 == "NEEDED" {print $2}')
done | sort -u
