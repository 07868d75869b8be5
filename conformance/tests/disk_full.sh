#!/bin/sh
# A run whose output filesystem fills up (issue 36 item 1, NOTE [disk full] in
# conformance/launch/launcher.hpp): a 4 MiB tmpfs left with about 300 KiB free; `gradcert run
# --backend ddp --world 2` must exit 2 with a first line naming ENOSPC, the file and the
# filesystem, and an earlier report on the same filesystem must stay as it was.
#   conformance/tests/disk_full.sh GRADCERT   (exit 77: no small tmpfs can be mounted here)
gradcert=$1
d=$(mktemp -d)
if ! mount -t tmpfs -o size=4m tmpfs "$d" 2>/dev/null; then
  echo "disk-full: cannot mount a small tmpfs here (needs root and mount rights): skipped"
  rmdir "$d"
  exit 77
fi
trap 'umount "$d"; rmdir "$d"' EXIT
"$gradcert" run --backend single --out "$d/earlier" >/dev/null 2>&1 || { echo "disk-full: the earlier run failed"; exit 1; }
before=$(cd "$d/earlier" && find . -type f -exec sha256sum {} + | sort | sha256sum)
free_k=$(df -k --output=avail "$d" | tail -1)
dd if=/dev/zero of="$d/fill" bs=1k count=$((free_k - 300)) 2>/dev/null
out=$("$gradcert" run --backend ddp --world 2 --out "$d/out" 2>&1)
rc=$?
echo "$out" | head -12
[ "$rc" -eq 2 ] || { echo "disk-full: expected exit 2, got $rc"; exit 1; }
echo "$out" | grep -q "the disk is full (ENOSPC): writing $d/out/runs/[^ ]* failed on filesystem $d (" ||
  { echo "disk-full: no ENOSPC line naming the file and the filesystem on the console"; exit 1; }
if [ -f "$d/out/report.json" ]; then
  grep -q "the disk is full (ENOSPC)" "$d/out/report.json" || { echo "disk-full: report.json does not name ENOSPC"; exit 1; }
else
  echo "disk-full: report.json could not be written either (the console says so)"
fi
after=$(cd "$d/earlier" && find . -type f -exec sha256sum {} + | sort | sha256sum)
[ "$before" = "$after" ] || { echo "disk-full: the earlier report changed"; exit 1; }
echo "disk-full: ok"
