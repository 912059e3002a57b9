"""The preflight role's effect, checked inside the converged containers."""
import json


def test_facts_dir_exists(host):
    d = host.file("/etc/ansible/facts.d")
    assert d.is_directory
    assert d.user == "root"
    assert d.mode == 0o755


def test_preflight_fact_records_the_distribution(host):
    f = host.file("/etc/ansible/facts.d/preflight.fact")
    assert f.exists, "role preflight did not write its local fact"
    fact = json.loads(f.content_string)
    assert fact["distribution"] == "Debian"
    assert fact["major_version"] == host.system_info.release.split(".")[0]
    assert fact["architecture"] == "x86_64"
