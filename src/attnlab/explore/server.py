"""``attnlab explore RUN --serve``: the explorer page on a local server that recomputes the
attention for new input.

The server listens on 127.0.0.1 only and answers two things: ``GET /`` (the page, with the input
form) and ``POST /api/explore`` (JSON ``{"text"}`` or ``{"image": data URL, "image_name"}``, plus
``"question"`` for VQA) with the new payload, or ``{"error": message}`` and status 400 for bad
input. Bodies are bounded; requests whose ``Host`` is not this machine's loopback name are
refused (a web page cannot reach the server through a rebound domain name). Nothing is written
anywhere: the model only reads.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import logging
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from attnlab.errors import UserError
from attnlab.explore.explorer import ExploreInput, Explorer
from attnlab.explore.images import MAX_IMAGE_BYTES
from attnlab.explore.page import render_page
from attnlab.explore.text import MAX_CHARS

__all__ = ["make_server", "MAX_BODY_BYTES"]

log = logging.getLogger(__name__)

#: largest request body (an image as a base64 data URL, plus the question)
MAX_BODY_BYTES = MAX_IMAGE_BYTES * 4 // 3 + 64 * 1024
_DATA_URL = re.compile(r"^data:[\w/+.-]*(;[\w=.-]+)*;base64,", re.ASCII)


def _input_from_json(body: dict) -> ExploreInput:
    """The :class:`ExploreInput` of a request body.

    Raises:
        UserError: fields of the wrong type, or an image that is not base64 data.
    """
    text, image, question = body.get("text"), body.get("image"), body.get("question")
    name = body.get("image_name") or "the uploaded image"
    for key, value in (
        ("text", text),
        ("image", image),
        ("question", question),
        ("image_name", name),
    ):
        if value is not None and not isinstance(value, str):
            raise UserError(f"{key} must be a string")
    data = None
    if image is not None:
        m = _DATA_URL.match(image)
        try:
            data = base64.b64decode(image[m.end() if m else 0 :], validate=True)
        except (binascii.Error, ValueError):
            raise UserError(f"{name} is not base64 image data") from None
    return ExploreInput(
        text=text, image=data, image_name=str(name)[:200], question=question or None
    )


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "attnlab-explore"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value) -> None:
        self._send(status, json.dumps(value, allow_nan=False).encode(), "application/json")

    def _host_ok(self) -> bool:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        return host in ("127.0.0.1", "localhost", "::1")

    def do_GET(self) -> None:
        if not self._host_ok():
            return self._send(HTTPStatus.FORBIDDEN, b"forbidden host", "text/plain")
        if self.path.split("?", 1)[0] not in ("/", "/index.html"):
            return self._send(HTTPStatus.NOT_FOUND, b"not found", "text/plain")
        srv = self.server
        page = render_page(srv.payload, serve=srv.form)
        self._send(HTTPStatus.OK, page.encode("utf-8"), "text/html; charset=utf-8")

    def do_POST(self) -> None:
        if not self._host_ok():
            return self._json(HTTPStatus.FORBIDDEN, {"error": "forbidden host"})
        if self.path != "/api/explore":
            return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            return self._json(HTTPStatus.LENGTH_REQUIRED, {"error": "Content-Length required"})
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            return self._json(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                {"error": f"the input is larger than {MAX_BODY_BYTES // 2**20} MB"},
            )
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise UserError("the request must be a JSON object")
            payload = self.server.explorer.explain(_input_from_json(body))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._json(HTTPStatus.BAD_REQUEST, {"error": "the request is not JSON"})
        except (UserError, ValueError) as err:
            return self._json(HTTPStatus.BAD_REQUEST, {"error": str(err)})
        except Exception as err:  # a bug: say so on the page, keep serving
            log.exception("explore failed")
            return self._json(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"error": f"internal error: {type(err).__name__}: {err}"},
            )
        self._json(HTTPStatus.OK, payload)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, explorer: Explorer, payload: dict | None) -> None:
        self.explorer, self.payload = explorer, payload
        self.form = {
            "input": explorer.input_kind,
            "question": explorer.takes_question,
            "max_chars": MAX_CHARS,
            "max_image_bytes": MAX_IMAGE_BYTES,
        }
        super().__init__(("127.0.0.1", port), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/"


def make_server(
    explorer: Explorer, *, port: int = 8000, first: ExploreInput | None = None
) -> _Server:
    """A server for ``explorer`` on ``127.0.0.1:port`` (0: any free port); call
    ``serve_forever()`` on it, ``url`` says where it is.

    Args:
        first: the input shown when the page opens (None: an empty page with the form).

    Raises:
        UserError: a bad first input; the port is in use, not allowed, or out of range.
    """
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be between 0 and 65535, got {port}")
    payload = explorer.explain(first) if first is not None else None
    try:
        return _Server(port, explorer, payload)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on 127.0.0.1 is in use: choose another with --port"
            ) from None
        if err.errno == errno.EACCES:
            raise UserError(
                f"port {port} needs privileges: choose one above 1023 with --port"
            ) from None
        raise
