"""compose.yaml: every command names an entry point that exists, every variable a
command needs is set, secrets only where they belong, and workers scale."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from conftest import EXAMPLES, REPO

from .conftest import COMPOSE, DOCKERFILE, argv, bind_mounts, environment, host_path

BROKER_URL = "redis://redis:6379/0"
RECORDS_URL = "http://records:8000"
SERVICES = {"redis", "sandbox", "service", "plugin", "flower", "records"}
WORKERS = ("sandbox", "service", "plugin")
#: Workers whose calls run under bubblewrap (declared tools, plugin handlers).
CONFINED = ("sandbox", "plugin")
#: Words that mark a variable as a credential.
SECRET_WORDS = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|AUTH|CREDENTIAL", re.IGNORECASE)
#: `${NAME}`, `${NAME:-default}`, `${NAME:?message}`: taken from the host's environment.
FROM_HOST = re.compile(r"^\$\{(?P<name>[A-Z_][A-Z0-9_]*)(?::?[-?][^}]*)?\}$")


def _deployment(service: dict[str, Any]) -> Path:
    """The host file behind the worker's `-d PATH`."""
    args = argv(service["command"])
    path = args[args.index("-d") + 1] if "-d" in args else args[args.index("--deployment") + 1]
    found = host_path(service, path)
    assert found is not None, f"{path} is not on a bind mount of the service"
    return found


def _search(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not found"
    return match[1]


def _env_names(values: list[Any]) -> set[str]:
    return {v[4:] for v in values if isinstance(v, str) and v.startswith("env:")}


def _grant_env_names(deployment: Path) -> set[str]:
    """Every `env:NAME` a grant of the deployment uses (url or header values)."""
    data = tomllib.loads(deployment.read_text())
    names: set[str] = set()
    for agent in data.get("agents", []):
        for grant in (agent.get("services") or {}).values():
            names |= _env_names([grant.get("url", ""), *(grant.get("headers") or {}).values()])
    return names


def _plugin_env_names(deployment: Path) -> set[str]:
    """Every `env:NAME` of the plugins' settings and of `[platform]`."""
    data = tomllib.loads(deployment.read_text())
    names: set[str] = set()
    for plugin in data.get("plugins", []):
        names |= _env_names(list((plugin.get("settings") or {}).values()))
    platform = data.get("platform") or {}
    names |= _env_names([platform.get("url", ""), *(platform.get("headers") or {}).values()])
    return names


def test_the_services_are_the_five_of_a_deployment(services: dict[str, Any]) -> None:
    assert set(services) == SERVICES


def test_redis_keeps_everything_and_never_evicts(services: dict[str, Any]) -> None:
    redis = services["redis"]
    assert str(redis["image"]).split(":")[0] == "redis"
    assert str(redis["image"]).split(":")[1].startswith("7")
    command = argv(redis["command"])
    assert command[0] == "redis-server"
    pairs = dict(zip(command[1::2], command[2::2], strict=False))
    assert pairs["--appendonly"] == "yes"
    assert pairs["--maxmemory-policy"] == "noeviction"
    # The append-only file lives on a named volume, not in the container.
    volumes = [str(v) for v in redis["volumes"]]
    assert any(v.split(":")[1] == "/data" and not v.startswith((".", "/")) for v in volumes)
    assert "redis-cli" in argv(redis["healthcheck"]["test"])
    assert "ports" not in redis


@pytest.mark.parametrize("name", ["sandbox", "service", "plugin", "flower"])
def test_every_celery_process_uses_the_compose_redis(services: dict[str, Any], name: str) -> None:
    env = environment(services[name])
    assert env["VESSEL_BROKER_URL"] == BROKER_URL
    # Results go to the same Redis unless a separate backend is set on purpose.
    assert env.get("VESSEL_RESULT_BACKEND", BROKER_URL).startswith("redis://redis:")
    assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", WORKERS)
def test_workers_scale(services: dict[str, Any], name: str) -> None:
    """`docker compose up --scale sandbox=4`: no fixed name, no host port."""
    worker = services[name]
    assert "container_name" not in worker
    assert "ports" not in worker
    assert "hostname" not in worker  # each replica's node name comes from its own
    assert "-n" not in argv(worker["command"]) and "--hostname" not in argv(worker["command"])


@pytest.mark.parametrize("name", WORKERS)
def test_worker_commands_parse_with_the_cli(services: dict[str, Any], name: str) -> None:
    from workers.cli import build_parser

    command = argv(services[name]["command"])
    assert command[0] == "vessel-workers"
    args = build_parser().parse_args(command[1:])
    assert args.verb == "worker"
    assert args.kind == name
    assert callable(args.run)


def test_vessel_workers_is_the_projects_entry_point() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["vessel-workers"] == "workers.cli:main"


def _container_view(service: dict[str, Any], folder: Path) -> Path:
    """The worker's deployment folder as the container sees it, rebuilt in `folder`.

    Its `-d` file's folder is a bind mount (./examples at /srv) with the
    deployment file mounted over it: copy the one, then put the other in place.
    """
    args = argv(service["command"])
    inside = PurePosixPath(args[args.index("-d") + 1])
    source = host_path(service, str(inside.parent))
    assert source is not None and source.is_dir(), f"{inside.parent} is not a mounted folder"
    view = folder / "srv"
    shutil.copytree(source, view)
    shutil.copyfile(_deployment(service), view / inside.name)
    return view / inside.name


def _examples_with_compose_urls(deployment: dict[str, Any]) -> dict[str, Any]:
    """`deployment` with each records grant's url pointing at the records container, and
    the weather plugin asking the real service (no stand-in URL, no private address)."""
    for agent in deployment.get("agents", []):
        grant = (agent.get("services") or {}).get("records")
        if grant is not None:
            grant["url"] = RECORDS_URL
    for plugin in deployment.get("plugins", []):
        if plugin["package"] == "plugins/weather":
            plugin.pop("private_egress", None)
            settings = plugin.get("settings") or {}
            settings.pop("forecast_url", None)
            if not settings:
                plugin.pop("settings", None)
    return deployment


@pytest.mark.parametrize("name", WORKERS)
def test_worker_deployment_is_the_examples(services: dict[str, Any], name: str) -> None:
    """Packages and data from ./examples; the deployment agrees with the example's."""
    service = services[name]
    args = argv(service["command"])
    folder = host_path(service, str(PurePosixPath(args[args.index("-d") + 1]).parent))
    assert folder == EXAMPLES.resolve()
    deployment = _deployment(service)
    assert deployment.is_file(), f"{deployment} does not exist"
    example = tomllib.loads((EXAMPLES / "deployment.toml").read_text())
    assert tomllib.loads(deployment.read_text()) == _examples_with_compose_urls(example), (
        f"{deployment.name} and examples/deployment.toml disagree (beyond the records url "
        "and the weather stand-in)"
    )
    # Workers read the deployment and the packages; they never write them.
    for volume in service["volumes"]:
        assert str(volume).endswith(":ro"), f"{name}: {volume} is mounted writable"


@pytest.mark.parametrize("name", ["service", "plugin"])
def test_every_kind_loads_the_same_deployment(services: dict[str, Any], name: str) -> None:
    assert _deployment(services["sandbox"]) == _deployment(services[name])
    assert bind_mounts(services["sandbox"]) == bind_mounts(services[name])


@pytest.mark.parametrize("name", WORKERS)
def test_worker_deployment_passes_check(
    services: dict[str, Any], name: str, tmp_path: Path
) -> None:
    """`vessel-workers check` accepts the deployment as the worker's container sees it."""
    deployment = _container_view(services[name], tmp_path)
    # The container's environment, less the broker (check needs none) and the
    # container paths; a value compose takes from the host gets a stand-in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("VESSEL_")}
    for key, value in environment(services[name]).items():
        if not key.startswith("VESSEL_"):
            env[key] = "stand-in-0123456789" if FROM_HOST.match(value) else value
    done = subprocess.run(
        [str(Path(sys.executable).parent / "vessel-workers"), "check", "-d", str(deployment)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_service_worker_has_every_secret_its_grants_name(services: dict[str, Any]) -> None:
    service = services["service"]
    env = environment(service)
    needed = _grant_env_names(_deployment(service))
    missing = needed - set(env)
    assert not missing, f"the service worker lacks {sorted(missing)}"
    for name in needed:
        value = env[name]
        match = FROM_HOST.match(value)
        if SECRET_WORDS.search(name):
            # A secret is passed from the host's environment, never written here.
            assert match is not None and match["name"] == name, f"{name} is written in the file"
            assert ":?" in value, f"{name} should refuse to start when unset"


def test_plugin_worker_has_every_secret_its_plugins_name(services: dict[str, Any]) -> None:
    plugin = services["plugin"]
    env = environment(plugin)
    needed = _plugin_env_names(_deployment(plugin))
    assert not needed - set(env), f"the plugin worker lacks {sorted(needed - set(env))}"
    for name in needed:
        if SECRET_WORDS.search(name):
            match = FROM_HOST.match(env[name])
            assert match is not None and match["name"] == name, f"{name} is written in the file"
    # It needs none of the grants' secrets.
    assert not set(env) & _grant_env_names(_deployment(plugin))


def test_sandbox_worker_holds_no_secret(services: dict[str, Any]) -> None:
    sandbox = services["sandbox"]
    env = environment(sandbox)
    grant_names = _grant_env_names(_deployment(sandbox)) | _plugin_env_names(_deployment(sandbox))
    assert not set(env) & grant_names
    assert not [name for name in env if SECRET_WORDS.search(name)]
    assert not [value for value in env.values() if FROM_HOST.match(value)]
    assert "env_file" not in sandbox
    assert "secrets" not in sandbox


def test_sandbox_cannot_reach_the_applications(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    nets = {name: set(svc.get("networks") or ["default"]) for name, svc in services.items()}
    assert not nets["sandbox"] & nets["records"], "a sandbox worker shares a network with an app"
    assert nets["service"] & nets["records"], "service workers cannot reach the records service"
    assert nets["sandbox"] & nets["redis"] and nets["service"] & nets["redis"]
    assert nets["flower"] & nets["redis"] and nets["plugin"] & nets["redis"]
    # Plugin workers make host.fetch themselves: one of their networks leads out.
    assert any(not compose["networks"][n].get("internal") for n in nets["plugin"])
    # The broker's network leads nowhere outside the host.
    (shared,) = nets["sandbox"]
    assert compose["networks"][shared]["internal"] is True


@pytest.mark.parametrize("name", CONFINED)
def test_confined_workers_have_the_container_options_bubblewrap_needs(
    services: dict[str, Any], name: str
) -> None:
    sandbox = services[name]
    options = set(sandbox["security_opt"])
    assert {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} <= options
    assert "no-new-privileges:true" in options
    assert sandbox["cap_drop"] == ["ALL"]
    assert not sandbox.get("cap_add")
    assert not sandbox.get("privileged")
    assert sandbox["read_only"] is True


@pytest.mark.parametrize("name", CONFINED)
def test_each_sandbox_option_is_explained_in_the_dockerfile(
    services: dict[str, Any], name: str
) -> None:
    text = DOCKERFILE.read_text()
    for option in services[name]["security_opt"]:
        assert f"security_opt {option}" in text, f"sandbox.Dockerfile does not explain {option}"
    assert "cap_drop ALL" in text


@pytest.mark.parametrize("name", CONFINED)
def test_sandbox_workspaces_are_a_private_tmpfs_of_the_image_user(
    services: dict[str, Any], name: str
) -> None:
    sandbox = services[name]
    root = environment(sandbox).get("VESSEL_WORKSPACE_ROOT")
    dockerfile = DOCKERFILE.read_text()
    if root is None:  # the image's default then
        root = _search(r"VESSEL_WORKSPACE_ROOT=(\S+)", dockerfile)
    uid = _search(r"useradd [^\n]*--uid (\d+)", dockerfile)
    tmpfs = {entry.split(":")[0]: entry.partition(":")[2] for entry in sandbox["tmpfs"]}
    assert root in tmpfs, f"no tmpfs at the workspace root {root}"
    opts = dict(opt.split("=", 1) for opt in tmpfs[root].split(",") if "=" in opt)
    assert opts["uid"] == uid
    assert opts["mode"] == "0700"
    assert "size" in opts


@pytest.mark.parametrize("name", ["sandbox", "service", "plugin", "flower", "records"])
def test_our_containers_drop_every_capability(services: dict[str, Any], name: str) -> None:
    svc = services[name]
    assert svc["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in svc["security_opt"]
    assert svc["read_only"] is True


@pytest.mark.parametrize("name", ["sandbox", "service", "plugin", "flower", "records"])
def test_our_containers_run_the_sandbox_image(services: dict[str, Any], name: str) -> None:
    build = services[name]["build"]
    assert (REPO / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE


def test_flower_loads_the_celery_app(services: dict[str, Any]) -> None:
    command = argv(services["flower"]["command"])
    assert command[:4] == ["celery", "-A", "broker.celery_app", "flower"]
    options = {a[2:].split("=")[0].replace("_", "-") for a in command[4:] if a.startswith("--")}
    from flower.options import options as flower_options

    unknown = options - set(flower_options._options)
    assert not unknown, f"Flower has no option {sorted(unknown)}"
    assert "--port=5555" in command
    # The module Flower loads builds the app from VESSEL_BROKER_URL alone.
    probe = (
        "import celery, broker.celery_app as m; "
        "assert isinstance(m.app, celery.Celery); print(m.app.conf.broker_url)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        env={**os.environ, "VESSEL_BROKER_URL": BROKER_URL},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == BROKER_URL


def test_flower_needs_its_password_and_keeps_the_api_closed(services: dict[str, Any]) -> None:
    flower = services["flower"]
    env = environment(flower)
    match = FROM_HOST.match(env["FLOWER_BASIC_AUTH"])
    assert match is not None and ":?" in env["FLOWER_BASIC_AUTH"]
    assert env.get("FLOWER_UNAUTHENTICATED_API", "false").lower() in ("false", "0", "")
    # Only the host's loopback reaches it.
    (port,) = flower["ports"]
    assert str(port).startswith("127.0.0.1:")
    assert str(port).endswith(":5555")


def test_flower_does_not_steer_the_workers(services: dict[str, Any]) -> None:
    assert "--read_only=True" in argv(services["flower"]["command"])


def test_records_runs_the_example_service(services: dict[str, Any]) -> None:
    records = services["records"]
    command = argv(records["command"])
    assert Path(command[0]).name.startswith("python")
    script = host_path(records, command[1])
    assert script == (EXAMPLES / "records_service.py").resolve()
    assert script.is_file()
    assert command[command.index("--port") + 1] == "8000"
    assert command[command.index("--host") + 1] == "0.0.0.0"
    env = environment(records)
    match = FROM_HOST.match(env["RECORDS_TOKEN"])
    assert match is not None and match["name"] == "RECORDS_TOKEN"
    # Its options are the script's own.
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert "--host" in done.stdout and "--port" in done.stdout


def test_service_worker_reaches_records_by_its_compose_name(
    compose: dict[str, Any], services: dict[str, Any]
) -> None:
    """The records grant must name the `records` container, not the host's loopback."""
    service = services["service"]
    data = tomllib.loads(_deployment(service).read_text())
    env = environment(service)
    urls = [
        grant["url"]
        for agent in data.get("agents", [])
        for name, grant in (agent.get("services") or {}).items()
        if name == "records"
    ]
    assert urls, "the example deployment grants no records service"
    for url in urls:
        resolved = env.get(url[4:], "") if url.startswith("env:") else url
        assert resolved == RECORDS_URL, f"the records grant's url {url!r} is not {RECORDS_URL}"
    # The service is named so, and listens on that port, on a network the worker shares.
    records = services["records"]
    command = argv(records["command"])
    assert f":{command[command.index('--port') + 1]}" in RECORDS_URL
    assert set(records["networks"]) & set(service["networks"])


def test_every_bind_mount_source_exists(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        for target, source in bind_mounts(svc).items():
            assert source.exists(), f"{name}: {source} (mounted on {target}) does not exist"
            assert source.is_relative_to(REPO), f"{name}: {source} is outside the project"


def test_named_volumes_are_declared(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for svc in services.values():
        for volume in svc.get("volumes") or []:
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared


def test_compose_file_is_where_compose_looks() -> None:
    assert COMPOSE.name == "compose.yaml"
    assert COMPOSE.parent == REPO
