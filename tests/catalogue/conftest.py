"""A deployment of 3 plugins and 40 tools, published by the real `vessel-workers check`.

    package "crew"   10 tools: 9 declared, 1 service (notes_save always listed,
                     notes_search deferred)
    plugin weather   10 tools (2 alwaysListed, 3 deferred)
    plugin mail      10 tools (1 alwaysListed, 4 deferred)
    plugin maps      10 tools (1 deferred, whose final name is over 64 characters)

Agents: `crew` (max_listed_tools 12, pins and denies), `open` (the defaults),
`few` (a `tools` list of 4), `tight` (max_listed_tools 3, past it by its pins).
The plugins' locks are written once per session by `check`; a test that
changes the deployment works on its own copy (`copy_tree`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

#: key: (description, parameters' properties, flag) per plugin, in registration order.
PLUGINS: dict[str, list[tuple[str, str, dict[str, str], str]]] = {
    "weather": [
        (
            "get_forecast",
            "Get tomorrow's temperature range for a latitude and longitude.",
            {"latitude": "Decimal degrees", "longitude": "Decimal degrees"},
            "alwaysListed",
        ),
        (
            "get_alerts",
            "List severe weather alerts, storms and floods, for a region.",
            {"region": "A region name"},
            "alwaysListed",
        ),
        (
            "air_quality",
            "Report the air quality index and pollen levels of a city.",
            {"city": "City name"},
            "",
        ),
        (
            "sunrise_times",
            "Tell the sunrise and sunset times for a date and place.",
            {"date": "ISO date"},
            "",
        ),
        (
            "tide_tables",
            "Give high and low tide times for a harbour on the coast.",
            {"harbour": "Harbour name"},
            "deferred",
        ),
        (
            "uv_index",
            "Report the ultraviolet index and sunburn risk for today.",
            {"city": "City name"},
            "",
        ),
        (
            "rain_radar",
            "Show the rain radar of precipitation over the next hour.",
            {"city": "City name"},
            "deferred",
        ),
        (
            "snow_depth",
            "Report the snow depth at ski resorts in the mountains.",
            {"resort": "Ski resort"},
            "deferred",
        ),
        (
            "wind_gusts",
            "Give wind speed and gusts for sailing and kite surfing.",
            {"spot": "A beach or lake"},
            "",
        ),
        (
            "climate_history",
            "Average temperatures of past decades for a city.",
            {"city": "City name"},
            "",
        ),
    ],
    "mail": [
        (
            "send_message",
            "Send an email message to one or more recipients.",
            {"to": "Recipients", "body": "The text"},
            "alwaysListed",
        ),
        ("list_inbox", "List the newest messages of the inbox.", {"count": "How many"}, ""),
        ("read_message", "Read one email message in full.", {"id": "Message id"}, ""),
        (
            "search_mail",
            "Search the mailbox by sender, subject or words.",
            {"query": "Words to find"},
            "",
        ),
        (
            "archive_thread",
            "Archive a whole email thread out of the inbox.",
            {"thread": "Thread id"},
            "deferred",
        ),
        (
            "label_thread",
            "Put a coloured label on an email thread.",
            {"thread": "Thread id", "label": "Label name"},
            "deferred",
        ),
        (
            "forward_message",
            "Forward an email message to someone else.",
            {"id": "Message id", "to": "Recipient"},
            "",
        ),
        (
            "draft_reply",
            "Write a draft reply to a message without sending it.",
            {"id": "Message id"},
            "",
        ),
        (
            "unsubscribe_list",
            "Unsubscribe from a newsletter mailing list.",
            {"sender": "Sender address"},
            "deferred",
        ),
        (
            "export_mailbox",
            "Export the whole mailbox as an mbox archive file.",
            {"folder": "Folder"},
            "deferred",
        ),
    ],
    "maps": [
        ("geocode_address", "Turn a street address into coordinates.", {"address": "Address"}, ""),
        (
            "route_directions",
            "Driving, cycling or walking directions between two places.",
            {"origin": "Start", "destination": "End"},
            "",
        ),
        (
            "nearby_places",
            "Find restaurants, shops and other places nearby.",
            {"kind": "Kind of place"},
            "",
        ),
        (
            "distance_matrix",
            "Travel times between many origins and destinations.",
            {"origins": "Starts"},
            "",
        ),
        (
            "traffic_report",
            "Current traffic jams and road works on a route.",
            {"road": "Road name"},
            "",
        ),
        ("transit_lines", "Bus, tram and train lines serving a stop.", {"stop": "Stop name"}, ""),
        (
            "elevation_profile",
            "Elevation and climbing along a hiking path.",
            {"path": "Coordinates"},
            "",
        ),
        (
            "timezone_lookup",
            "The time zone and local time at coordinates.",
            {"latitude": "Degrees"},
            "",
        ),
        ("static_map_image", "Render a map picture of an area as an image.", {"area": "Area"}, ""),
        (
            "reverse_geocode_coordinates_into_a_full_postal_address_record",
            "Turn coordinates back into a full postal address.",
            {"latitude": "Degrees"},
            "deferred",
        ),
    ],
}

#: name: (description, command or service, flag), in `[tools] declared` order.
PACKAGE: list[tuple[str, str, str, str]] = [
    ("echo", "Echo the arguments back as JSON.", "echo", ""),
    ("word_count", "Count the words of a text.", "echo", ""),
    ("list_files", "List the files of the workspace.", "echo", ""),
    ("notes_save", "Save a note for later.", "echo", "always_listed"),
    ("notes_search", "Search the saved notes for a phrase.", "found", "deferred"),
    ("calc", "Evaluate an arithmetic expression.", "echo", ""),
    ("shout", "Repeat a text in capitals.", "echo", ""),
    ("todo_add", "Add an item to the todo list.", "echo", ""),
    ("todo_list", "Show the todo list.", "echo", ""),
    ("records_lookup", "Look up a customer record by its id.", "service", ""),
]

ECHO = "import sys; print(sys.stdin.read())"
FOUND = "import json, sys; print('found: ' + json.load(sys.stdin)['phrase'])"

DEPLOYMENT = """\
[[plugins]]
package = "plugins/weather"
[[plugins]]
package = "plugins/mail"
[[plugins]]
package = "plugins/maps"

[[agents]]
id = "crew"
package = "crew"
max_listed_tools = 12
[agents.mounts]
"/data" = "data"
[agents.services.records]
url = "http://127.0.0.1:9"
[agents.access]
deny = ["weather__air_quality", "mail__export_mailbox", "todo_add"]
pin = ["mail__archive_thread", "maps__traffic_report"]

[[agents]]
id = "open"
package = "crew"
[agents.mounts]
"/data" = "data"
[agents.services.records]
url = "http://127.0.0.1:9"

[[agents]]
id = "few"
package = "crew"
[agents.services.records]
url = "http://127.0.0.1:9"
[agents.access]
tools = ["echo", "calc", "weather__get_forecast", "maps__geocode_address"]

[[agents]]
id = "tight"
package = "crew"
max_listed_tools = 3
[agents.services.records]
url = "http://127.0.0.1:9"
[agents.access]
pin = ["calc", "maps__geocode_address"]
"""


def _plugin_source(slug: str) -> str:
    lines = []
    for key, description, properties, flag in PLUGINS[slug]:
        props = {p: {"type": "string", "description": d} for p, d in properties.items()}
        entry = {"description": description, "parameters": {"type": "object", "properties": props}}
        if flag:
            entry[flag] = True
        body = json.dumps(entry)[:-1]
        lines.append(
            f"globalThis.tools.{key} = {body}, "
            f"handler: (input) => ({{ tool: {json.dumps(key)}, input }}) }};"
        )
    return "\n".join(lines) + "\n"


def _tool_file(name: str, description: str, how: str, flag: str) -> str:
    text = f'name = "{name}"\ndescription = "{description}"\n'
    if how == "service":
        text += 'service = "records"\npath = "/lookup"\n'
    else:
        text += f"command = {json.dumps(['python3', '-c', FOUND if how == 'found' else ECHO])}\n"
    if flag:
        text += f"{flag} = true\n"
    text += '[parameters]\ntype = "object"\n[parameters.properties.phrase]\ntype = "string"\n'
    text += 'description = "The words"\n'
    return text


def write_tree(folder: Path) -> Path:
    """The deployment's files in `folder` (no locks yet); its deployment.toml's path."""
    for slug in PLUGINS:
        plugin = folder / "plugins" / slug
        (plugin / "src").mkdir(parents=True)
        (plugin / "plugin.toml").write_text(f'slug = "{slug}"\nsources = ["src/{slug}.js"]\n')
        (plugin / "src" / f"{slug}.js").write_text(_plugin_source(slug))
    crew = folder / "crew"
    (crew / "tools").mkdir(parents=True)
    declared = [f"tools/{name}.toml" for name, *_ in PACKAGE]
    (crew / "vessel.toml").write_text(f"[tools]\ndeclared = {json.dumps(declared)}\n")
    for name, description, how, flag in PACKAGE:
        (crew / "tools" / f"{name}.toml").write_text(_tool_file(name, description, how, flag))
    (folder / "data").mkdir()
    path = folder / "deployment.toml"
    path.write_text(DEPLOYMENT)
    return path


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, stdin: str = "") -> Any:
    """`vessel-workers ARGS` in `cwd`, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        input=stdin,
    )


@dataclass(frozen=True)
class Published:
    """The deployment after `check`: its path and what check printed."""

    path: Path
    check_stdout: str

    @property
    def folder(self) -> Path:
        return self.path.parent


@pytest.fixture(scope="session")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    path = write_tree(tmp_path_factory.mktemp("catalogue"))
    done = cli("check", "-d", str(path), cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    return Published(path=path, check_stdout=done.stdout)


def copy_tree(published: Published, into: Path) -> Path:
    """A copy of the published deployment (locks included) to change; its deployment.toml."""
    target = into / "copy"
    shutil.copytree(published.folder, target)
    return target / "deployment.toml"


@pytest.fixture
def client(published: Published) -> Any:
    """A client of the published deployment with an in-process broker and no worker:
    enough for the list, search_tools and call_tool's refusals."""
    from broker.celery_app import make_app
    from broker.client import VesselClient
    from broker.config import Settings
    from broker.embedded import LocalAdmission
    from broker.loading import load_deployment

    settings = Settings.from_environ({})
    app = make_app(settings, longest_tool_seconds=30.0)
    found = VesselClient(
        load_deployment(published.path), settings, app=app, admission=LocalAdmission()
    )
    yield found
    found.close()
    app.close()


def embedded_env() -> dict[str, str]:
    """The environment of a command line run on the embedded default (no broker)."""
    import os

    drop = {"VESSEL_BROKER_URL", "VESSEL_RESULT_BACKEND", "VESSEL_SENTINEL_MASTER"}
    return {k: v for k, v in os.environ.items() if k not in drop}
