"""Whether the ranks of a process group can reach each other here (no torch imported)."""

from labtext import N_

NO_LOOPBACK = N_(
    "the sandbox cannot bring up the loopback of its network namespace, so the ranks of a "
    "process group cannot reach each other: grant the grader the NET_ADMIN capability "
    "(docker run --cap-add=NET_ADMIN; compose: cap_add: [SYS_ADMIN, NET_ADMIN]) or allow "
    "user namespaces"
)


def loopback_is_up() -> bool:
    """Whether this network namespace's loopback interface is up (reading needs no rights)."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, 0x8913, struct.pack("16sh", b"lo", 0)))[1]
    return bool(flags & 1)
