import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BARE = ("probes", "correlator", "store", "webui")


def test_every_module_imports_only_under_the_gpuwhy_namespace():
    # Run from the repository root with '' on sys.path: the place where a bare
    # `import probes` would succeed by accident.
    code = (
        "import pkgutil, sys, gpuwhy\n"
        "for pkg in ('gpuwhy', 'gpuwhy.probes', 'gpuwhy.correlator', 'gpuwhy.store',"
        " 'gpuwhy.webui'):\n"
        "    mod = __import__(pkg, fromlist=['x'])\n"
        "    for info in pkgutil.walk_packages(mod.__path__, pkg + '.'):\n"
        "        if info.name != 'gpuwhy.__main__':\n"
        "            __import__(info.name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BARE!r}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_components_are_the_top_level_folders():
    import gpuwhy.correlator
    import gpuwhy.probes
    import gpuwhy.store
    import gpuwhy.webui

    for module, folder in ((gpuwhy.probes, "probes"), (gpuwhy.correlator, "correlator"),
                           (gpuwhy.store, "store"), (gpuwhy.webui, "webui")):
        assert Path(module.__file__).resolve().parent == REPO / folder


@pytest.mark.slow
def test_built_wheel_carries_bpf_sources_templates_and_static_files(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                             "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    [wheel] = tmp_path.glob("gpuwhy-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("gpuwhy/probes/fdtrack.bpf.c", "gpuwhy/webui/templates/processes.html",
                     "gpuwhy/webui/static/processes.js", "gpuwhy/py.typed",
                     "gpuwhy/store/migrations.py",
                     "gpuwhy/rules/builtin/a_host_starvation.rules",
                     "gpuwhy/probes/cuda/cuda.bpf.c", "gpuwhy/webui/templates/report.html",
                     "gpuwhy/webui/static/report.css", "gpuwhy/app/demo/standin.py",
                     "gpuwhy/app/deploy/checkenv.py", "gpuwhy/app/checks/watch.py"):
        assert expected in names
    assert not any(n.split("/")[0] in BARE for n in names)


@pytest.mark.parametrize("entry", ["gpuwhy.app.cli", "gpuwhy.probes.privileged"])
def test_the_command_line_and_the_probes_load_no_web_stack(entry):
    # `gpuwhy probes` (and every other command) starts by importing gpuwhy.app.cli: what it loads
    # is in the probes process's memory for good; the web view's stack loads where it runs.
    code = (f"import sys, {entry}, gpuwhy.app.cli\n"
            "print(sorted(m for m in ('flask', 'werkzeug', 'jinja2', 'gpuwhy.webui', "
            "'gpuwhy.app.service', 'gpuwhy.correlator.pipeline') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
