# Prints what a tool can learn about the host: it should be next to nothing.
import os
import pathlib
import socket

print("environment:", sorted(os.environ))
for name in ("environ", "cmdline"):
    print(f"/proc/1/{name}:", pathlib.Path(f"/proc/1/{name}").read_bytes()[:200])
print("processes:", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
for path in ("/etc/shadow", "/root", "/home", "/var", "/run"):
    print(path, "exists" if os.path.exists(path) else "absent")
try:
    socket.create_connection(("1.1.1.1", 443), timeout=1)
    print("network: CONNECTED")
except OSError as exc:
    print("network: refused:", exc)
try:
    socket.socket(socket.AF_UNIX).bind(os.environ["HOME"] + "/sock")
    print("unix socket: BOUND")
except OSError as exc:
    print("unix socket: refused:", exc)
