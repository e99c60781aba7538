import pathlib, pytest, time
from tests.portable import start_service, subprocess_env, free_port, ServiceFailed, JOB_SERVICE_MODULE
from tests.test_runners import dataflow_dry_run, no_network  # noqa: F401

def test_bad_service(tmp_path):
    p = free_port()
    with pytest.raises(ServiceFailed) as e:
        start_service("job_service", JOB_SERVICE_MODULE, [f"--port={p}", "--bogus"], p, tmp_path, subprocess_env(), 30)
    print(str(e.value)[:600])

def test_slow_service(tmp_path):
    p = free_port()
    t = time.monotonic()
    with pytest.raises(ServiceFailed) as e:
        start_service("sleeper", "http.server", ["--help"], p, tmp_path, subprocess_env(), 3)
    print(str(e.value)[:300])

def test_gs_output(tmp_path, monkeypatch, no_network):
    dataflow_dry_run(tmp_path, monkeypatch, "--output=gs://imgrec-test-bucket/datasets/sample")
