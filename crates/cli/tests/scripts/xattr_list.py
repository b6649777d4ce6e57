# Run as root in DIR: listxattr(2) of a file with ever more long names, up
# to past what a list may take (64 KiB: E2BIG) and past what a frame of
# the protocol holds (1 MiB and 64 KiB: 4,500 names). One line per step,
# compared between tmpfs and the mount.
import os, sys

p = os.path.join(sys.argv[1], "names")
open(p, "w").close()
made = 0
for total in (10, 200, 261, 262, 4500):
    while made < total:
        # 250 bytes a name: 251 listed with its NUL.
        os.setxattr(p, "user." + ("%05d" % made) * 49, b"")
        made += 1
    try:
        print(total, "listed", len(os.listxattr(p)))
    except OSError as e:
        print(total, e.strerror)
os.unlink(p)
