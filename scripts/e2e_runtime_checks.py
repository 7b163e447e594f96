#!/usr/bin/env python3
"""What the node's runtime enforces on a running mail container, seen from the node
(as root): scripts/e2e-cluster.sh runs this with the PID of the container's process.

    e2e_runtime_checks.py PID MEMORY_LIMIT_BYTES DATA_DIR [SYSCTL=VALUE ...]

- the process runs as UID/GID 65532 with no capabilities, no new privileges and a
  seccomp filter;
- its root filesystem is read-only: a write to / fails with EROFS even as root in
  the container's mount namespace, while its data directory (an emptyDir) takes a
  write as 65532;
- its memory limit is a cgroup limit: the memory cgroup of the container has it,
  and a process placed in that cgroup that allocates past it is killed by the
  kernel's OOM killer (the cgroup's oom_kill count rises), not stopped by a check
  of the server's;
- each SYSCTL=VALUE is what /proc/sys shows inside the container's network
  namespace (the Pod's sysctls, when the MailCluster sets spec.tuning).

Nothing here needs a tool inside the image (it has no shell): the checks enter the
container's namespaces with setns(2) from this interpreter.
"""

import ctypes
import errno
import os
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
libc = ctypes.CDLL(None, use_errno=True)


def fail(msg):
    print(f"FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.strip()
    return fields


def in_child(fn):
    """Runs fn() in a forked child; returns its exit status (os.waitpid's)."""
    child = os.fork()
    if child == 0:
        try:
            code = fn()
        except BaseException as e:  # the parent reads the exit code only
            print(f"child: {e!r}", file=sys.stderr)
            code = 99
        os._exit(code)
    _, st = os.waitpid(child, 0)
    return st


def enter(pid, nstype, name):
    fd = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY)
    if libc.setns(fd, nstype) != 0:
        raise OSError(ctypes.get_errno(), f"setns {name}")
    os.close(fd)


def memory_cgroup(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, controllers, path = line.strip().split(":", 2)
            if "memory" in controllers.split(","):
                return f"/sys/fs/cgroup/memory{path}"
    fail("no memory cgroup (cgroup v1) for the container")


def oom_kills(cgroup):
    with open(f"{cgroup}/memory.oom_control") as f:
        for line in f:
            k, v = line.split()
            if k == "oom_kill":
                return int(v)
    return 0


def main():
    pid, limit, data_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    sysctls = dict(a.split("=", 1) for a in sys.argv[4:])

    s = status(pid)
    uids, gids = s["Uid"].split(), s["Gid"].split()
    if set(uids) != {"65532"} or set(gids) != {"65532"}:
        fail(f"the container's process runs as Uid {uids} Gid {gids}, not 65532")
    for cap in ("CapEff", "CapPrm", "CapBnd"):
        if int(s[cap], 16) != 0:
            fail(f"{cap} is {s[cap]}: capabilities were not all dropped")
    if s.get("NoNewPrivs") != "1":
        fail(f"NoNewPrivs is {s.get('NoNewPrivs')}")
    if s.get("Seccomp") != "2":
        fail(f"Seccomp is {s.get('Seccomp')}, not 2 (a filter)")
    print(f"process {pid}: uid/gid 65532, no capabilities, no new privileges, seccomp filter")

    def write_root():
        enter(pid, CLONE_NEWNS, "mnt")
        try:
            with open("/mailcluster-root-probe", "w") as f:
                f.write("x")
        except OSError as e:
            return 0 if e.errno == errno.EROFS else 2
        return 1

    st = in_child(write_root)
    if os.WEXITSTATUS(st) != 0:
        fail(f"a write to / as root in the container was not refused with EROFS (child status {st})")

    def write_data():
        enter(pid, CLONE_NEWNS, "mnt")
        os.setgroups([])
        os.setgid(65532)
        os.setuid(65532)
        path = os.path.join(data_dir, ".runtime-probe")
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return 0

    st = in_child(write_data)
    if os.WEXITSTATUS(st) != 0:
        fail(f"65532 could not write to {data_dir} (child status {st}): the check of / proves nothing")
    print(f"root filesystem read-only (EROFS as root); {data_dir} writable by 65532")

    for name, want in sysctls.items():
        def read_sysctl(name=name):
            enter(pid, CLONE_NEWNET, "net")
            # /proc/sys shows the namespace of the reader: this process, now in the Pod's.
            with open("/proc/sys/" + name.replace(".", "/")) as f:
                got = " ".join(f.read().split())
            print(f"{name} = {got}")
            return 0 if got == " ".join(want.split()) else 1

        st = in_child(read_sysctl)
        if os.WEXITSTATUS(st) != 0:
            fail(f"{name} in the Pod is not {want}")

    cgroup = memory_cgroup(pid)
    with open(f"{cgroup}/memory.limit_in_bytes") as f:
        cg_limit = int(f.read())
    if cg_limit != limit:
        fail(f"the container's memory cgroup limit is {cg_limit}, not the Pod's {limit}")
    before = oom_kills(cgroup)

    def allocate_past_limit():
        # Chosen first by the OOM killer (the server keeps its own score).
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        with open(f"{cgroup}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        held, chunk = [], 16 << 20
        for _ in range(2 * limit // chunk + 8):
            held.append(bytearray(chunk))  # zero-filled: every page touched
        return 3  # never killed: the limit is not enforced

    st = in_child(allocate_past_limit)
    after = oom_kills(cgroup)
    if not (os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGKILL):
        fail(f"a process allocating past {limit} bytes in the container's cgroup was not killed (status {st})")
    if after <= before:
        fail(f"the cgroup's oom_kill count stayed {before}: the kill was not the OOM killer's")
    if status(pid).get("State", "").startswith("Z") or not os.path.exists(f"/proc/{pid}"):
        fail("the mail process died instead of the allocating one")
    print(f"memory limit {limit} is the cgroup's: allocating past it was SIGKILLed by the OOM killer "
          f"(oom_kill {before} -> {after}); the mail process lives on")


if __name__ == "__main__":
    main()
