"""TCP round trips between two lab hosts, for bench/netlab's delayed rates.

    netlab_rtt.py serve PORT         answer every byte with itself, one client
    netlab_rtt.py ping HOST PORT     200 round trips of 1 byte; prints the
                                     median and the 10th and 90th percentiles

TCP_NODELAY on both ends, so each byte is a packet each way: what the
links' delay adds to a request and its answer, without the queueing that
a loaded link adds on top.
"""
import socket
import sys
import time

N = 200


def serve(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(1)
        if not b:
            return
        c.sendall(b)


def ping(host, port):
    c = socket.create_connection((host, port), timeout=10)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ts = []
    for _ in range(N):
        t = time.perf_counter()
        c.sendall(b"x")
        if not c.recv(1):
            sys.exit("netlab_rtt: the server closed the connection")
        ts.append(time.perf_counter() - t)
    ts.sort()
    print("median %.0f us (10%%: %.0f, 90%%: %.0f)" % (ts[N // 2] * 1e6, ts[N // 10] * 1e6, ts[N * 9 // 10] * 1e6))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "ping":
        ping(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(__doc__)
