"""A local stand-in for the Open-Meteo forecast API, for trying the weather plugin. Standard
library only.

    python examples/weather_service.py --port 8124

It answers `GET /v1/forecast?latitude=..&longitude=..&daily=temperature_2m_max,
temperature_2m_min&forecast_days=2` the way the real service does, with a
`daily` object holding one value per day for each variable asked for. The
temperatures are made up but stable: they depend only on the coordinates (colder
towards the poles), so a test can predict them (`forecast`).

Anything else gets a 404 or a 400 with a JSON body saying what was wrong. It
prints `weather service listening on http://HOST:PORT` once it accepts
connections (`--port 0` picks a free port).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["VARIABLES", "forecast", "main"]

FORECAST_PATH = "/v1/forecast"
VARIABLES = ("temperature_2m_max", "temperature_2m_min")
#: Days one answer may hold, as the real API allows.
MAX_DAYS = 16


def forecast(latitude: float, longitude: float, days: int) -> dict[str, list[Any]]:
    """The made-up `daily` block: warmer near the equator, a little warmer each day."""
    base = 30.0 - abs(latitude) * 0.5 + (longitude % 7) * 0.1
    start = datetime.date(2026, 1, 1)
    return {
        "time": [(start + datetime.timedelta(days=d)).isoformat() for d in range(days)],
        "temperature_2m_max": [round(base + 4 + d * 0.5, 1) for d in range(days)],
        "temperature_2m_min": [round(base - 4 + d * 0.5, 1) for d in range(days)],
    }


class Handler(BaseHTTPRequestHandler):
    server_version = "weather-service/1"
    disable_nagle_algorithm = True

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        if parts.path != FORECAST_PATH:
            self._send(404, {"error": True, "reason": f"no endpoint at {parts.path}"})
            return
        query = parse_qs(parts.query)
        try:
            latitude = float(query["latitude"][0])
            longitude = float(query["longitude"][0])
            days = int(query.get("forecast_days", ["7"])[0])
        except (KeyError, ValueError):
            self._send(400, {"error": True, "reason": "latitude and longitude must be numbers"})
            return
        if not (-90 <= latitude <= 90 and -180 <= longitude <= 180 and 1 <= days <= MAX_DAYS):
            self._send(400, {"error": True, "reason": "coordinates or forecast_days out of range"})
            return
        asked = [v for v in query.get("daily", [""])[0].split(",") if v]
        unknown = [v for v in asked if v not in VARIABLES]
        if unknown:
            self._send(400, {"error": True, "reason": f"unknown daily variable {unknown[0]}"})
            return
        daily = forecast(latitude, longitude, days)
        self._send(
            200,
            {
                "latitude": latitude,
                "longitude": longitude,
                "daily_units": {v: "°C" for v in asked},
                "daily": {k: v for k, v in daily.items() if k == "time" or k in asked},
            },
        )

    def log_message(self, format: str, *args: Any) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8124)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"weather service listening on http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
