"""How ``evoagent`` reads its command line before typer does: a bare ``--ray`` is a local
cluster (typer options cannot take an optional value)."""

from evoagent.cli import with_bare_ray


def test_a_bare_ray_flag_means_a_local_cluster():
    assert with_bare_ray(["run", "t.yaml", "--ray"]) == ["run", "t.yaml", "--ray", "local"]
    assert with_bare_ray(["run", "t.yaml", "--ray", "--ray-workers", "3"]) == [
        "run", "t.yaml", "--ray", "local", "--ray-workers", "3"]
    assert with_bare_ray(["run", "t.yaml", "--ray", "head:6379"]) == ["run", "t.yaml", "--ray", "head:6379"]
    assert with_bare_ray(["run", "t.yaml", "--resume"]) == ["run", "t.yaml", "--resume"]
