"""What the examples share: one command starts N members of a swarm on this
machine, each a copy of the example's own script with --rank and --ports."""
import os
import socket
import subprocess
import sys


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch(script, processes, base_port=0):
    """Runs `script` with this command's arguments plus --rank=I and
    --ports=P0,P1,... for I in 0..processes-1; the worst exit code."""
    if not 1 <= processes <= 8:
        sys.exit("--processes: expected 1 to 8")
    ports = (list(range(base_port, base_port + processes)) if base_port
             else free_ports(processes))
    procs = [subprocess.Popen([sys.executable, script, *sys.argv[1:],
                               "--rank=%d" % rank,
                               "--ports=%s" % ",".join(map(str, ports))])
             for rank in range(processes)]
    try:
        return max(p.wait() for p in procs)
    except KeyboardInterrupt:  # Ctrl-C reaches every member: each leaves
        return max(p.wait() for p in procs)


def main(script, a, member):
    """The launcher (no --rank), or member `a.rank` (run by the launcher)."""
    if a.rank < 0:
        return launch(os.path.abspath(script), a.processes, a.base_port)
    return member(a)


def add_member_args(ap):
    ap.add_argument("--processes", type=int, default=2,
                    help="members to start (2-4)")
    ap.add_argument("--base_port", type=int, default=0,
                    help="first member's port (0: free ports)")
    ap.add_argument("--rank", type=int, default=-1, help="(internal)")
    ap.add_argument("--ports", default="", help="(internal)")


def swarm_for(starling, a, run_id):
    """The member's starling.Swarm: loopback, plaintext, all N at the start."""
    ports = [int(p) for p in a.ports.split(",")]
    return starling.Swarm(
        node_id="m%d" % a.rank, listen="127.0.0.1:%d" % ports[a.rank],
        peers=["127.0.0.1:%d" % ports[0]] if a.rank else None,
        run_id=run_id, insecure=True, min_members=len(ports))
