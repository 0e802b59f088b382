# syntax=docker/dockerfile:1
#
# The hardened host image of vessel-workers: bubblewrap, libseccomp, the project
# in its own virtualenv, a non-root user. Sandbox workers, service workers and
# Flower all run from it (compose.yaml); the default command is a sandbox worker.
#
#   docker build -f sandbox.Dockerfile -t vessel-workers .
#
# What bubblewrap needs from the container (compose.yaml sets exactly these on
# the sandbox service; `docker run` takes the same as --security-opt/--cap-drop):
#
#   security_opt seccomp=unconfined     Docker's default seccomp profile allows
#                                       clone/unshare with namespace flags, mount,
#                                       umount2, pivot_root and setns only to a
#                                       container holding CAP_SYS_ADMIN; bwrap needs
#                                       them without it. The tools
#                                       themselves still run under the worker's own
#                                       seccomp filter (workers/sandbox/seccomp.py),
#                                       applied by bwrap to every call. A stricter
#                                       choice is Docker's default profile with those
#                                       syscalls moved out of the CAP_SYS_ADMIN rule
#                                       (seccomp=/path/to/profile.json).
#   security_opt apparmor=unconfined    docker-default's AppArmor profile denies
#                                       mount(2), even inside a new user namespace.
#   security_opt systempaths=unconfined Docker masks parts of /proc (kcore, keys,
#                                       timer_list, ...) with bind mounts; the kernel
#                                       then refuses a fresh procfs to a new pid
#                                       namespace ("mount too revealing"), and
#                                       bwrap's `--proc /proc` fails with EPERM.
#                                       Harmless here: the worker is uid 10001 with
#                                       no capabilities, so /proc/kcore, sysrq-trigger
#                                       and /proc/sys stay closed to it by permission.
#   security_opt no-new-privileges:true bwrap is not setuid on Debian 12 (it uses
#                                       unprivileged user namespaces), so nothing
#                                       here needs to gain privileges.
#   cap_drop ALL                        bwrap run by a non-root user needs no
#                                       capability in the container: it gets the ones
#                                       it needs inside the user namespace it creates,
#                                       and drops them before the tool runs.
#   read_only + tmpfs                   the root stays read-only; workspaces live on a
#                                       tmpfs owned by this user (below), /tmp too.
#
# And from the host kernel: unprivileged user namespaces (Debian and RHEL kernels
# allow them; Ubuntu 23.10+ needs kernel.apparmor_restrict_unprivileged_userns=0
# or an AppArmor profile for bwrap) and user.max_user_namespaces > 0. A sandbox
# worker checks confinement at start and refuses to start, with a message, when
# any of this is missing.

# The static Landlock prefix every sandbox call starts with (workers/sandbox/
# command_prefix.py; without it, calls start Perl: ~1.6 ms more each). Compiled
# in a stage of its own, so the image carries no compiler. It needs no headers
# and no libc: gcc alone.
FROM python:3.11-slim-bookworm AS landlock-prefix
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY workers ./workers
RUN python -m workers.sandbox.command_prefix /out/landlock-exec

FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# System packages: the one list is .ci/apt-packages.txt (CI installs the same).
COPY .ci/apt-packages.txt /tmp/apt-packages.txt
RUN apt-get update \
    && sed -e 's/#.*//' /tmp/apt-packages.txt | xargs apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* /tmp/apt-packages.txt

# The user every process of the container runs as. A fixed uid, so the tmpfs
# options in compose.yaml (uid=10001) and file ownership agree.
RUN groupadd --system --gid 10001 vessel \
    && useradd --system --uid 10001 --gid vessel --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin vessel

# The project, in a virtualenv under /opt: the sandbox binds /usr but not /opt,
# so tools never see the worker's code or its dependencies.
WORKDIR /build
COPY pyproject.toml README.md ./
COPY broker ./broker
COPY workers ./workers
RUN python -m venv /opt/vessel \
    && /opt/vessel/bin/pip install /build \
    && rm -rf /build
ENV PATH=/opt/vessel/bin:$PATH
# Where the workers look for it: <the virtualenv>/libexec/vessel-workers/.
COPY --from=landlock-prefix /out/landlock-exec /opt/vessel/libexec/vessel-workers/landlock-exec

# The example deployment (compose.yaml mounts ./examples over it).
COPY examples /srv

# Per-turn workspaces: owned by the worker's user, private to it. compose.yaml
# mounts a tmpfs here (the root is read-only); without one it is image storage.
ENV VESSEL_WORKSPACE_ROOT=/var/lib/vessel-workers/workspaces \
    VESSEL_DEPLOYMENT=/srv/deployment.toml
RUN install -d -o vessel -g vessel -m 0700 /var/lib/vessel-workers /var/lib/vessel-workers/workspaces

USER vessel
WORKDIR /srv

# tini is PID 1: it passes SIGTERM on to the worker (a warm shutdown: running
# calls finish and store their results) and reaps processes a killed tool left.
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["vessel-workers", "worker", "sandbox", "-d", "/srv/deployment.toml"]
