#!/usr/bin/python3
"""Stand-in of Grafana's server (/usr/share/grafana/bin/grafana) for the test lab.

Grafana comes from Grafana's own package repository, which tests cannot reach. This stand-in has
the real package's paths, unit and command line and the parts of its HTTP API corectl and its tests
use, over what Grafana would have loaded from its provisioning directory:

    grafana server --config=/etc/grafana/grafana.ini [--pidfile=F] [--packaging=deb]
                   [cfg:default.paths.provisioning=DIR] [cfg:default.paths.data=DIR] ...
    grafana --version

- The ini file's [server] http_addr/http_port, [security] admin_user/admin_password and
  [auth.anonymous] enabled/org_role.
- provisioning/datasources/*.yaml (apiVersion 1, datasources: name, type, uid, url) and
  provisioning/dashboards/*.yaml (providers of type file: options.path, folder): every *.json
  below a provider's path is a dashboard, reread on each request (Grafana polls). Like Grafana, a
  provisioning file that is not valid YAML, a datasource without a name, or a dashboard without a
  uid or title stops the server at start (a dashboard file broken later is logged and skipped).
- GET /api/health; /api/search (dashboards); /api/dashboards/uid/UID; /api/datasources and
  /api/datasources/uid/UID; /api/datasources/proxy/uid/UID/<path> (forwards a GET to the
  datasource's url, as Grafana's data source proxy does). Anonymous viewers (when enabled) may GET;
  otherwise HTTP basic auth as the admin. POST /api/dashboards/db (admin: a dashboard pushed through
  the API, kept in memory).
"""

from __future__ import annotations

import base64
import configparser
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

VERSION = "11.6.0"


class ProvisioningError(Exception):
    pass


def settings(argv: list[str]) -> tuple[configparser.ConfigParser, dict[str, str]]:
    config = configparser.ConfigParser(interpolation=None)
    overrides: dict[str, str] = {}
    for arg in argv:
        if arg.startswith("--config="):
            config.read(arg.split("=", 1)[1])
        elif arg.startswith("cfg:"):
            key, _, value = arg[4:].partition("=")
            overrides[key] = value
    return config, overrides


def load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProvisioningError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ProvisioningError(f"{path}: not a mapping")
    return data


def datasources(provisioning: Path) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((provisioning / "datasources").glob("*.y*ml")):
        for source in load_yaml(path).get("datasources") or []:
            if not source.get("name"):
                raise ProvisioningError(f"{path}: a datasource without a name")
            uid = source.get("uid") or source["name"]
            found[uid] = {**source, "uid": uid}
    return found


def providers(provisioning: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((provisioning / "dashboards").glob("*.y*ml")):
        for provider in load_yaml(path).get("providers") or []:
            if provider.get("type", "file") == "file" and (provider.get("options") or {}).get("path"):
                found.append(provider)
    return found


def dashboards(provs: list[dict[str, Any]], strict: bool) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for provider in provs:
        for path in sorted(Path(provider["options"]["path"]).rglob("*.json")):
            try:
                board = json.loads(path.read_text())
                if not board.get("uid") or not board.get("title"):
                    raise ValueError("no uid or title")
            except (OSError, ValueError) as exc:
                if strict:
                    raise ProvisioningError(f"dashboard {path}: {exc}") from None
                print(f"grafana: skipping dashboard {path}: {exc}", file=sys.stderr)
                continue
            found[board["uid"]] = {"dashboard": board, "folder": provider.get("folder", ""), "file": str(path)}
    return found


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, fmt: str, *args: Any) -> None:
        pass

    def reply(self, code: int, body: Any) -> None:
        self.send(code, json.dumps(body).encode())

    def send(self, code: int, data: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def role(self) -> str:
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, password = base64.b64decode(auth[6:]).decode(errors="replace").partition(":")
            if (user, password) == (self.server.admin_user, self.server.admin_password):
                return "Admin"
            return ""
        return self.server.anonymous_role

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        parts = [urllib.parse.unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["api", "health"]:
            return self.reply(200, {"database": "ok", "version": VERSION, "commit": "standin"})
        if not self.role():
            return self.reply(401, {"message": "Unauthorized"})
        boards = {**self.server.boards(), **self.server.pushed}
        if parts == ["api", "search"]:
            query = urllib.parse.parse_qs(url.query).get("query", [""])[0].lower()
            found = [(uid, b["dashboard"], b["folder"]) for uid, b in sorted(boards.items())]
            return self.reply(200, [
                {"uid": uid, "title": d["title"], "type": "dash-db", "tags": d.get("tags", []), "folderTitle": folder}
                for uid, d, folder in found if query in d["title"].lower()
            ])  # fmt: skip
        if parts[:3] == ["api", "dashboards", "uid"] and len(parts) == 4:
            board = boards.get(parts[3])
            if board is None:
                return self.reply(404, {"message": "Dashboard not found"})
            meta = {"provisioned": "file" in board, "provisionedExternalId": Path(board.get("file", "")).name,
                    "folderTitle": board["folder"]}  # fmt: skip
            return self.reply(200, {"dashboard": board["dashboard"], "meta": meta})
        if parts == ["api", "datasources"]:
            return self.reply(200, list(self.server.sources.values()))
        if parts[:3] == ["api", "datasources", "uid"] and len(parts) == 4:
            source = self.server.sources.get(parts[3])
            return self.reply(200, source) if source else self.reply(404, {"message": "Data source not found"})
        if parts[:4] == ["api", "datasources", "proxy", "uid"] and len(parts) >= 5:
            return self.proxy(parts[4], "/".join(parts[5:]), url.query)
        return self.reply(404, {"message": "Not found"})

    def proxy(self, uid: str, path: str, query: str) -> None:
        source = self.server.sources.get(uid)
        if source is None:
            return self.reply(404, {"message": "Data source not found"})
        target = source.get("url", "").rstrip("/") + "/" + path + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(target, timeout=30) as answer:
                code, body = answer.status, answer.read()
        except urllib.error.HTTPError as exc:
            code, body = exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            return self.reply(502, {"message": f"data source proxy error: {exc}"})
        return self.send(code, body)

    def do_POST(self) -> None:
        if urllib.parse.urlsplit(self.path).path.rstrip("/") != "/api/dashboards/db":
            return self.reply(404, {"message": "Not found"})
        if self.role() != "Admin":
            return self.reply(403 if self.role() else 401, {"message": "Permission denied"})
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            board = body["dashboard"]
            uid, _title = board["uid"], board["title"]
        except (ValueError, KeyError, TypeError):
            return self.reply(400, {"message": "bad request data"})
        self.server.pushed[uid] = {"dashboard": board, "folder": body.get("folderUid", "")}
        return self.reply(200, {"status": "success", "uid": uid, "version": board.get("version", 1)})


class Server(ThreadingHTTPServer):
    def __init__(self, address: tuple[str, int], config: configparser.ConfigParser, provisioning: Path) -> None:
        self.sources = datasources(provisioning)
        self.providers = providers(provisioning)
        dashboards(self.providers, strict=True)
        self.pushed: dict[str, dict[str, Any]] = {}
        self.admin_user = config.get("security", "admin_user", fallback="admin")
        self.admin_password = config.get("security", "admin_password", fallback="admin")
        anonymous = config.getboolean("auth.anonymous", "enabled", fallback=False)
        self.anonymous_role = config.get("auth.anonymous", "org_role", fallback="Viewer") if anonymous else ""
        super().__init__(address, Handler)

    def boards(self) -> dict[str, dict[str, Any]]:
        return dashboards(self.providers, strict=False)


def main(argv: list[str]) -> int:
    if "--version" in argv or "-v" in argv:
        print(f"grafana version {VERSION}")
        return 0
    if not argv or argv[0] != "server":
        print("usage: grafana server --config=FILE [cfg:default.paths.provisioning=DIR ...]", file=sys.stderr)
        return 2
    config, overrides = settings(argv[1:])
    provisioning = Path(
        overrides.get("default.paths.provisioning")
        or config.get("paths", "provisioning", fallback="/etc/grafana/provisioning")
    )
    address = config.get("server", "http_addr", fallback="") or "0.0.0.0"
    port = config.getint("server", "http_port", fallback=3000)
    try:
        server = Server((address, port), config, provisioning)
    except ProvisioningError as exc:
        print(f"grafana: provisioning failed: {exc}", file=sys.stderr)
        return 1
    for arg in argv[1:]:
        if arg.startswith("--pidfile="):
            Path(arg.split("=", 1)[1]).write_text(f"{os.getpid()}\n")
    print(f"grafana {VERSION} (stand-in) listening on {address}:{port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
