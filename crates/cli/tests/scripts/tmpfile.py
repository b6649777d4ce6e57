# Run as root in DIR: open(O_TMPFILE), then linkat names it (by the
# descriptor, and by /proc/self/fd), unless it was made O_EXCL; one line
# per step, compared between tmpfs and the mount.
import ctypes
import errno
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, AT_SYMLINK_FOLLOW, AT_EMPTY_PATH = -100, 0x400, 0x1000


def linkat(fd, name, by_proc):
    if by_proc:
        r = libc.linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), AT_FDCWD, name.encode(), AT_SYMLINK_FOLLOW)
    else:
        r = libc.linkat(fd, b"", AT_FDCWD, name.encode(), AT_EMPTY_PATH)
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]


os.chdir(sys.argv[1])
fd = os.open(".", os.O_TMPFILE | os.O_RDWR, 0o640)
os.write(fd, b"hello")
st = os.fstat(fd)
print("made", oct(st.st_mode), st.st_nlink, st.st_size, sorted(os.listdir(".")))
print("linked", linkat(fd, "named", False), os.fstat(fd).st_nlink, open("named").read())
print("linked again", linkat(fd, "again", True), os.fstat(fd).st_nlink)
os.close(fd)
excl = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_EXCL, 0o600)
print("O_EXCL", linkat(excl, "never", False))
os.close(excl)
try:
    os.open("named", os.O_TMPFILE | os.O_RDWR, 0o600)
except OSError as e:
    print("in a file", errno.errorcode[e.errno])
print("left", sorted(os.listdir(".")), os.stat("named").st_nlink)
