#!/usr/bin/env python3
"""A webhook receiver for the test (Alertmanager's webhook_configs): each POST body, one JSON line, in a file."""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]


class Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # http.server calls it by this name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(LOG, "a", encoding="utf-8") as out:
            out.write(json.dumps(body) + "\n")
        self.send_response(200)
        self.end_headers()


HTTPServer(("127.0.0.1", PORT), Hook).serve_forever()
