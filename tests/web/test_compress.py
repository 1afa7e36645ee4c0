"""Static files sent gzipped to a browser that accepts it, once per version of the file, with
an ETag of their own that a revalidation answers with 304; as they are to one that does not."""

from __future__ import annotations

import gzip
from pathlib import Path

from gpuwhy.config import load_config
from gpuwhy.webui import create_app

ROOT = Path(__file__).resolve().parents[2]
GZIP = {"Accept-Encoding": "gzip, deflate, br"}


def _client(tmp_path):
    config = load_config(environ={"GPUWHY_DB": str(tmp_path / "gpuwhy.db")})
    return create_app(config, {"TESTING": True}).test_client()


def test_the_chart_library_and_the_pages_files_go_gzipped_and_cached(tmp_path):
    client = _client(tmp_path)
    plain = client.get("/vendor/echarts.min.js")
    assert plain.status_code == 200 and "Content-Encoding" not in plain.headers
    assert plain.data == (ROOT / "node_modules/echarts/dist/echarts.min.js").read_bytes()
    packed = client.get("/vendor/echarts.min.js", headers=GZIP)
    assert packed.status_code == 200 and packed.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(packed.data) == plain.data
    assert len(packed.data) < 0.4 * len(plain.data)                    # 1.03 MB -> ~0.33 MB
    assert int(packed.headers["Content-Length"]) == len(packed.data)
    assert "Accept-Encoding" in packed.headers["Vary"]
    assert packed.headers["Cache-Control"] == "public, max-age=3600"
    assert packed.headers["ETag"] != plain.headers["ETag"]
    again = client.get("/vendor/echarts.min.js",
                       headers={**GZIP, "If-None-Match": packed.headers["ETag"]})
    assert again.status_code == 304 and again.data == b""
    assert client.get("/vendor/echarts.min.js", headers={
        "If-None-Match": plain.headers["ETag"]}).status_code == 304
    for name in ("style.css", "charts.js", "overview.js"):
        response = client.get(f"/static/{name}", headers=GZIP)
        assert response.headers["Content-Encoding"] == "gzip", name
        assert gzip.decompress(response.data) == (ROOT / "webui/static" / name).read_bytes()
        assert response.headers["Cache-Control"] == "no-cache" and response.headers["ETag"]
    # pages and JSON are not touched here
    assert "Content-Encoding" not in client.get("/api/gpus", headers=GZIP).headers
