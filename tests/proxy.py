"""A real shared cache for tests: nginx with ``proxy_cache`` in front of one upstream, set up as a caching reverse
proxy usually is. Its cache key is the URL alone (nginx's default, ``$scheme$proxy_host$request_uri``: no token).
It keeps what the upstream's Cache-Control (or Expires) lets it keep, for as long as it says, and a 200 that says
nothing for 10 minutes (``proxy_cache_valid 200``); it does not store an answer that is ``private``,
``no-store`` or ``no-cache``, sets a cookie or says ``Vary: *``.

Each answer carries ``X-Cache-Status`` (nginx's ``$upstream_cache_status``: MISS, HIT, EXPIRED, ...; empty when
the request did not go through the cache). deploy/services.sh installs nginx (Debian's ``nginx-light``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from server.embedded import free_port, wait_http

CACHE_STATUS = "x-cache-status"

_CONFIG = """\
{user}
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    proxy_cache_path {dir}/cache levels=1:2 keys_zone=shared:4m max_size=1g inactive=1h use_temp_path=off;
    server {{
        listen 127.0.0.1:{port};
        location = /proxy-healthz {{ return 200 "ok"; }}
        location / {{
            proxy_pass {upstream};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_cache shared;
            proxy_cache_valid 200 10m;
            add_header X-Cache-Status $upstream_cache_status always;
        }}
    }}
}}
"""


def nginx() -> str:
    """The nginx binary; deploy/services.sh installs it where it is missing."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
    if not found:
        subprocess.run(["bash", str(Path(__file__).resolve().parents[1] / "deploy" / "services.sh")], check=True)
        found = shutil.which("nginx") or "/usr/sbin/nginx"
    return found


class CachingProxy:
    """nginx caching everything ``upstream`` (``http://host:port``) lets a shared cache keep, on a free port.
    A context manager; ``url`` is where clients send their requests."""

    def __init__(self, upstream: str, work_dir: Path):
        self.upstream, self.dir = upstream.rstrip("/"), work_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> CachingProxy:
        self.dir.mkdir(parents=True, exist_ok=True)
        # Started by root, nginx's workers would run as nobody, who cannot enter the test's temp dirs.
        user = "user root;" if os.geteuid() == 0 else ""
        conf = self.dir / "nginx.conf"
        conf.write_text(_CONFIG.format(user=user, dir=self.dir, port=self.port, upstream=self.upstream))
        # -e: the error log from the first line on, before the config is read (not /var/log/nginx).
        self.proc = subprocess.Popen(
            [nginx(), "-p", str(self.dir), "-e", str(self.dir / "error.log"), "-c", str(conf)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_http(f"{self.url}/proxy-healthz", 30, self.proc)
        except Exception:  # noqa: BLE001 - any failure to start is reported with nginx's log
            self.stop()
            raise RuntimeError(f"nginx did not start: {self.log()}") from None
        return self

    def log(self) -> str:
        path = self.dir / "error.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGQUIT)  # graceful: workers finish what they are sending
        deadline = time.monotonic() + 10
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> CachingProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
