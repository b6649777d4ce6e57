#!/bin/sh
# Run as root: an overlay file system whose upper layer (and work
# directory) is under $1, over a lower layer made here; changes made
# through it, then what it shows, then the same after it is mounted
# again. Prints what the overlay shows and what its upper layer holds,
# for comparison between a tmpfs and the mount.
set -eu
base=$1
lower=$base/lower
merged=$base/merged
mkdir -p "$lower/sub" "$base/upper" "$base/work" "$merged"
echo lower > "$lower/l.txt"
echo y > "$lower/sub/y"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$base/upper,workdir=$base/work" "$merged"
trap 'umount "$merged" 2>/dev/null || true' EXIT
show() {
    (cd "$1" && find . -mindepth 1 | sort | while read -r p; do
        # (Not a directory's size: tmpfs counts its entries' bytes.)
        stat -c "%n %F %a %t:%T" "$p"
        if [ -f "$p" ]; then cat "$p"; fi
    done)
}
cd "$merged"
echo new > new.txt
echo more >> l.txt
rm sub/y
mv l.txt moved.txt
mkdir d2
echo deep > d2/f
rm -r sub
mv d2 d3
cd /
echo "== merged"
show "$merged"
echo "== upper"
show "$base/upper"
umount "$merged"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$base/upper,workdir=$base/work" "$merged"
echo "== merged again"
show "$merged"
