# Tries to outlive the call; prints what the kernel said to each attempt.
import os
import subprocess
import time

for name, attempt in (("setsid", os.setsid), ("setpgid", lambda: os.setpgid(0, 0))):
    try:
        attempt()
        print(name, "ESCAPED")
    except OSError as exc:
        print(name, "refused:", exc)
subprocess.Popen(
    ["nohup", "sh", "-c", "while :; do date >> $HOME/still-alive; sleep 0.2; done"],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
if os.fork() == 0:  # double fork: the grandchild is orphaned, reparented to pid 1
    if os.fork() == 0:
        while True:
            time.sleep(1)
    os._exit(0)
time.sleep(0.2)
print("left two background processes; both die with this call")
