# Run as root in DIR: the file attribute ioctls lsattr and chattr use. One
# line per step, compared between tmpfs and the mount.
import errno, fcntl, os, struct, sys

GETFLAGS, SETFLAGS = 0x80086601, 0x40086602
FSGETXATTR, TCGETS = 0x801C581F, 0x5401
IMMUTABLE = 0x10
d = sys.argv[1]
f, sub, fifo = (os.path.join(d, n) for n in ("file", "sub", "fifo"))
open(f, "w").close()
os.mkdir(sub)
os.mkfifo(fifo)


def step(name, path, cmd, arg, flags=os.O_RDONLY):
    fd = os.open(path, flags | os.O_NONBLOCK)
    try:
        r = fcntl.ioctl(fd, cmd, arg)
        print(name, "ok", r.hex() if isinstance(r, bytes) else r)
    except OSError as e:
        print(name, errno.errorcode[e.errno])
    finally:
        os.close(fd)


step("getflags file", f, GETFLAGS, b"\0" * 8)
step("getflags directory", sub, GETFLAGS, b"\0" * 8)
step("getflags fifo", fifo, GETFLAGS, b"\0" * 8)
step("clear flags", f, SETFLAGS, struct.pack("l", 0))
step("fsgetxattr", f, FSGETXATTR, b"\0" * 28)
step("tcgets", f, TCGETS, b"\0" * 64)
step("set immutable", f, SETFLAGS, struct.pack("l", IMMUTABLE))
step("flags now", f, GETFLAGS, b"\0" * 8)
try:
    with open(f, "w") as w:
        w.write("x")
    print("write ok")
except OSError as e:
    print("write", errno.errorcode[e.errno])
step("clear flags", f, SETFLAGS, struct.pack("l", 0))
