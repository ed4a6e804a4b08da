"""A Hugging Face hub stand-in on 127.0.0.1, answering as the real hub does (headers included), so that
huggingface_hub's own client runs against it unchanged.

Repositories (``org/name``) and what the server answers for their files:
- a repository in ``files``: 200 for its files (ETag, X-Repo-Commit, Content-Length), 404
  ``EntryNotFound`` for any other file, 404 ``RevisionNotFound`` for a revision but main or ``COMMIT``;
- any other ``org/name``: 404 ``RepoNotFound`` (what the hub answers with a token);
- ``private/<name>``: 401 ``RepoNotFound`` (what the hub answers without a token, for a name it does
  not have or a private one);
- ``gated/<name>``: 401 ``GatedRepo`` without an ``Authorization`` header, 403 ``GatedRepo`` with one;
- ``down/<name>``: 503;
- ``drop/<name>``: the connection is closed without an answer;
- ``slow/<name>`` (a repository in ``files``): answered as any, but a GET's body is sent one byte
  every ``trickle_s`` seconds (a hub or proxy that trickles the download).
Every request is recorded in ``requests``.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    files: dict[str, dict[str, bytes]] = field(
        default_factory=dict
    )  # repo id -> filename -> bytes
    requests: list[tuple[str, str, bool]] = field(
        default_factory=list
    )  # (method, path, had a token)
    server: http.server.ThreadingHTTPServer | None = None
    trickle_s: float = 0.5

    @property
    def endpoint(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo_id: str, filename: str, content: dict) -> None:
        self.files.setdefault(repo_id, {})[filename] = json.dumps(content).encode()

    def start(self) -> "FakeHub":
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                hub._answer(self, body=False)

            def do_GET(self) -> None:
                hub._answer(self, body=True)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def _answer(self, handler: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        token = handler.headers.get("Authorization") is not None
        self.requests.append((handler.command, handler.path, token))
        parts = handler.path.split("?")[0].strip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound"}, b"", body)
        org, name, revision, filename = parts[0], parts[1], parts[3], "/".join(parts[4:])
        repo_id = f"{org}/{name}"
        if org == "drop":
            handler.close_connection = True
            handler.connection.close()
            return None
        if org == "down":
            return self._send(handler, 503, {}, b"service unavailable", body)
        if org == "gated":
            return self._send(
                handler, 403 if token else 401, {"X-Error-Code": "GatedRepo"}, b"", body
            )
        if org == "private":
            return self._send(handler, 401, {"X-Error-Code": "RepoNotFound"}, b"", body)
        if repo_id not in self.files:
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound"}, b"", body)
        if revision not in ("main", COMMIT):
            return self._send(handler, 404, {"X-Error-Code": "RevisionNotFound"}, b"", body)
        content = self.files[repo_id].get(filename)
        if content is None:
            return self._send(
                handler, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, b"", body
            )
        etag = '"' + hashlib.sha1(content).hexdigest() + '"'
        return self._send(
            handler,
            200,
            {"ETag": etag, "X-Repo-Commit": COMMIT, "Content-Type": "application/json"},
            content,
            body,
            trickle_s=self.trickle_s if org == "slow" else 0.0,
        )

    @staticmethod
    def _send(
        handler,
        status: int,
        headers: dict[str, str],
        content: bytes,
        body: bool,
        trickle_s: float = 0.0,
    ) -> None:
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        if body and trickle_s:
            import time

            for i in range(len(content)):
                try:
                    handler.wfile.write(content[i : i + 1])
                    handler.wfile.flush()
                except OSError:  # the client gave up
                    return
                time.sleep(trickle_s)
        elif body:
            handler.wfile.write(content)
