# Run as root in DIR: which changes take away the capabilities a file
# grants (its security.capability, as setcap sets it), by root and by a
# user who may write the file, and what that user may do to the
# attribute itself. One line per case, compared between tmpfs and the
# mount.
import os, struct, sys

d = sys.argv[1]
USER = 1000
CAPS = "security.capability"
# VFS_CAP_REVISION_2: cap_net_raw, permitted and effective.
VALUE = struct.pack("<IIIII", 0x02000001, 1 << 13, 0, 0, 0)


CASES = {
    "write": lambda p: os.write(os.open(p, os.O_WRONLY), b"y"),
    "append": lambda p: os.write(os.open(p, os.O_WRONLY | os.O_APPEND), b"y"),
    "truncate": lambda p: os.truncate(p, 0),
    "ftruncate": lambda p: os.ftruncate(os.open(p, os.O_WRONLY), 0),
    "open-trunc": lambda p: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC)),
    "chown-same": lambda p: os.chown(p, -1, -1),
    "fallocate": lambda p: os.posix_fallocate(os.open(p, os.O_WRONLY), 0, 100),
    "copy-into": lambda p: os.copy_file_range(os.open(os.path.join(d, "src"), os.O_RDONLY), os.open(p, os.O_WRONLY), 1),
    "chmod": lambda p: os.chmod(p, 0o644),
    "utime": lambda p: os.utime(p, None),
    "read": lambda p: os.read(os.open(p, os.O_RDONLY), 1),
    "removexattr": lambda p: os.removexattr(p, CAPS),
    "setxattr": lambda p: os.setxattr(p, CAPS, VALUE),
    "set-other": lambda p: os.setxattr(p, "security.other", b"1"),
}

with open(os.path.join(d, "src"), "w") as f:
    f.write("source")
os.chmod(os.path.join(d, "src"), 0o644)
for who in (0, USER):
    for name, case in CASES.items():
        p = os.path.join(d, name)
        with open(p, "w") as f:
            f.write("x")
        os.chmod(p, 0o666)
        os.chown(p, USER, USER)
        os.setxattr(p, CAPS, VALUE)
        pid = os.fork()
        if pid == 0:
            if who:
                os.setgid(USER)
                os.setuid(USER)
            try:
                case(p)
                r = "ok"
            except OSError as e:
                r = e.strerror
            print(f"uid {who} {name}: {r}, caps kept: {CAPS in os.listxattr(p)}", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        os.unlink(p)
