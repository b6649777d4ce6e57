# Run as root in DIR: what a handle may do once opened, and whose ids
# decide the privileges a write drops. One line per case, compared
# between tmpfs and the mount.
import os, shutil, socket, sys

d = sys.argv[1]
USER = 1000


def path(name):
    p = os.path.join(d, name)
    if os.path.lexists(p):
        os.unlink(p)
    return p


def make(name, mode, data=b"data"):
    p = path(name)
    with open(p, "wb") as f:
        f.write(data)
    os.chmod(p, mode)
    return p


def as_user(f):
    """f() in a child with the user's ids; its line on stdout."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.setgroups([])
        os.setgid(USER)
        os.setuid(USER)
        try:
            out = f()
        except OSError as e:
            out = "error " + (e.strerror or str(e))
        os.write(w, str(out).encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    return out


def attempt(f):
    try:
        return str(f())
    except OSError as e:
        return "error " + (e.strerror or str(e))


# 1. The user opens a file they may write; the owner then takes every
# permission away; the handle still reads and writes.
def after_chmod(target, mode, begin, finish):
    """The user runs begin() in a child; root then chmods target to mode;
    then the child's finish(what begin returned): what it returns."""
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setgroups([]); os.setgid(USER); os.setuid(USER)
        begun = begin()
        os.write(w, b"x")
        os.read(go_r, 1)
        os.write(w, str(finish(begun)).encode())
        os._exit(0)
    os.read(r, 1)
    os.chmod(target, mode)
    os.write(go_w, b"x")
    out = os.read(r, 4096).decode()
    os.waitpid(pid, 0)
    return out


p = make("shared", 0o666)
uses = lambda fd: " ".join([attempt(lambda: os.pwrite(fd, b"W", 0)), attempt(lambda: os.pread(fd, 4, 0)),
                            attempt(lambda: os.lseek(fd, 0, os.SEEK_DATA)),
                            attempt(lambda: os.posix_fallocate(fd, 0, 10)), attempt(lambda: os.ftruncate(fd, 3))])
print("chmod 000 after open:", after_chmod(p, 0o000, lambda: os.open(p, os.O_RDWR), uses))

# 2. Opening checks the mode: the user may not open root's 0600 file,
# and may run a program they may only execute.
p = make("private", 0o600)
print("open 0600 of another:", as_user(lambda: os.open(p, os.O_RDONLY) and "opened"))
exe = path("exec-only")
shutil.copyfile("/bin/true", exe)
os.chmod(exe, 0o711)
print("run 0711:", as_user(lambda: os.waitpid(os.spawnv(os.P_NOWAIT, exe, [exe]), 0)[1]))

# 3. Root opens a setuid file, then drops to the user and writes: the
# write drops setuid and setgid (the writer has no CAP_FSETID).
for mode in (0o6777, 0o2767, 0o4766):
    p = make("suid", mode)
    fd = os.open(p, os.O_WRONLY)
    out = as_user(lambda: os.pwrite(fd, b"x", 0))
    os.close(fd)
    print(f"root's handle, user writes {mode:o}:", out, oct(os.stat(p).st_mode & 0o7777))

# 4. The user opens a world-writable setuid file and hands the handle to
# root, who writes: root keeps the bits.
for mode in (0o6777, 0o4777):
    p = make("suid", mode)
    parent, child = socket.socketpair(socket.AF_UNIX)
    pid = os.fork()
    if pid == 0:
        os.setgroups([]); os.setgid(USER); os.setuid(USER)
        socket.send_fds(child, [b"fd"], [os.open(p, os.O_WRONLY)])
        os._exit(0)
    _, fds, _, _ = socket.recv_fds(parent, 2, 1)
    os.waitpid(pid, 0)
    print(f"user's handle, root writes {mode:o}:", os.pwrite(fds[0], b"x", 0), oct(os.stat(p).st_mode & 0o7777))
    os.close(fds[0])

# 5. The user lists a directory of 3,000 names (more than a page the
# mount fetches at once); root takes the user's access away midway; the
# listing goes on to the end.
def first_ten(d):
    it = os.scandir(os.open(d, os.O_RDONLY | os.O_DIRECTORY))
    return it, [next(it).name for _ in range(10)]


big = path("big")
os.mkdir(big)
for i in range(3000):
    open(os.path.join(big, f"f{i:05}"), "w").close()
rest = lambda begun: attempt(lambda: len(begun[1]) + len([e.name for e in begun[0]]))
print("listing after chmod 700:", after_chmod(big, 0o700, lambda: first_ten(big), rest))

# 6. The user holds a handle of root's file and calls chown(-1, -1): on a
# setuid file refused (it would clear the bit), on another allowed; and a
# fallocate through the user's handle of a world-writable setuid file
# succeeds and clears the bits (the mount gets an attribute change that
# sets nothing for both calls). Before session 32 the mount let the
# first, and left the bit.
for mode in (0o4755, 0o0755, 0o6777):
    p = make("held", mode)
    def held():
        fd = os.open(p, os.O_RDWR if mode & 0o2 else os.O_RDONLY)
        out = attempt(lambda: os.chown(p, -1, -1))
        if mode & 0o2:
            out += " " + attempt(lambda: os.posix_fallocate(fd, 0, 8192))
        return out
    print(f"user's chown(-1, -1) of {mode:o} held:", as_user(held), oct(os.stat(p).st_mode & 0o7777))
