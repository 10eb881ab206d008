"""Runtime environments: environment variables and a working directory that a remote
function's calls run with (``runtime_env=`` on ``remote``, ``options`` and ``init``), put back
after each call so the next task of a warm interpreter starts as before; ``pip`` read as Ray
writes it (test_processes.py installs a requirement on a worker process); what escher does not
do yet (``conda``) and bad values refused before anything is submitted."""

import os

import pytest

import escher


@escher.remote
def env_of(name):
    import os

    return os.environ.get(name)


def test_env_vars_hold_for_the_call_only(cluster):
    with_env = env_of.options(runtime_env={"env_vars": {"SP43_COLOR": "blue"}})
    assert with_env.remote("SP43_COLOR").result(timeout=60) == "blue"
    # The same warm interpreters, without the variable.
    assert escher.get([env_of.remote("SP43_COLOR") for _ in range(4)]) == [None] * 4


def test_a_working_dir_is_shipped_and_importable(cluster, tmp_path):
    (tmp_path / "helpers_sp43.py").write_text("def triple(x):\n    return 3 * x\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "numbers.txt").write_text("1 2 3\n")
    (tmp_path / "big.bin").write_bytes(os.urandom(64 * 1024))  # the function travels once

    @escher.remote(runtime_env={"working_dir": str(tmp_path), "env_vars": {"SCALE": "2"}})
    def use_it(x):
        import os

        import helpers_sp43

        numbers = [int(n) for n in open("data/numbers.txt").read().split()]
        return helpers_sp43.triple(x) * int(os.environ["SCALE"]), sum(numbers), os.getcwd()

    results = escher.get([use_it.remote(i) for i in range(3)])
    assert [r[:2] for r in results] == [(0, 6), (6, 6), (12, 6)]
    # Unpacked by each interpreter into a folder of its own, named by the archive's content
    # hash.
    from escher import _runtime_env

    digest = _runtime_env.pack(str(tmp_path))[1]
    folder = results[0][2]
    for r in results:
        assert os.path.basename(r[2]).startswith(digest + "."), r
        assert os.path.basename(os.path.dirname(r[2])) == "working-dirs", r

    @escher.remote
    def cwd():
        import os
        import sys

        return os.getcwd(), folder in sys.path

    # Put back: the next call of another function is not in the working directory.
    assert all(c != folder and not on_path for c, on_path in escher.get([cwd.remote() for _ in range(4)]))


def test_a_planted_folder_is_never_taken_for_a_working_dirs_content(cluster, tmp_path):
    # Another task of the namespace plants a folder under the hash of this working directory
    # (where an earlier release unpacked it, and with the name any unpacking would start with).
    (tmp_path / "planted_sp45.py").write_text("WHO = 'the driver'\n")
    from escher import _runtime_env

    archive, digest = _runtime_env.pack(str(tmp_path))

    @escher.remote
    def plant(digest, remove):
        import os
        import shutil

        root = os.path.join(os.environ["HOME"], ".escher", "working-dirs")
        for name in (digest, digest + ".planted"):
            folder = os.path.join(root, name)
            if remove:
                shutil.rmtree(folder, ignore_errors=True)
                continue
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, "planted_sp45.py"), "w") as f:
                f.write("WHO = 'the planter'\n")
        if not remove:
            # What an interpreter that has ended left: its folder and its lock, held by none.
            os.makedirs(os.path.join(root, digest + ".ended"), exist_ok=True)
            open(os.path.join(root, digest + ".ended.lock"), "w").close()
        return sorted(n for n in os.listdir(root) if n.startswith(digest))

    @escher.remote(runtime_env={"working_dir": str(tmp_path)})
    def who():
        import os

        import planted_sp45

        return planted_sp45.WHO, os.getcwd()

    assert digest + ".ended" in plant.remote(digest, False).result(timeout=60)
    try:
        for name, folder in escher.get([who.remote() for _ in range(4)]):
            assert name == "the driver", folder
            assert os.path.basename(folder) not in (digest, digest + ".planted"), folder
        # The ended interpreter's folder was swept by an unpacking; the planted ones, which
        # have no lock, are not escher's and are left.
        left = plant.remote(digest, True).result(timeout=60)
        assert digest + ".ended" not in left and digest + ".ended.lock" not in left, left
    finally:
        plant.remote(digest, True).result(timeout=60)

    # An archive that is not what its hash says is refused, naming both.
    fake = _runtime_env._WithEnv(lambda: None, {}, archive + b"x", digest)
    with pytest.raises(ValueError, match="not the " + digest):
        fake()


def test_init_gives_every_function_its_runtime_env():
    import subprocess
    import sys

    code = (
        "import escher\n"
        "escher.init(runtime_env={'env_vars': {'FROM_INIT': 'yes'}})\n"
        "@escher.remote\n"
        "def read():\n"
        "    import os\n"
        "    return os.environ.get('FROM_INIT')\n"
        "own = read.options(runtime_env={'env_vars': {'FROM_INIT': 'own'}})\n"
        "print(read.remote().result(timeout=60), own.remote().result(timeout=60))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["yes", "own"], done.stdout


def test_what_escher_does_not_do_and_bad_values_are_refused(tmp_path):
    for env, says in [
        ({"conda": "env.yaml"}, "not supported yet"),
        ({"pip": "requests"}, "cannot be read"),
        ({"pip": [1]}, "list of requirements"),
        ({"pip": ["--index-url=https://example.org", "requests"]}, "an option of pip"),
        ({"pip": ["a\nb"]}, "one requirement on one line"),
        ({"pip": {"packages": ["requests"], "pip_version": "==23"}}, "'packages': [...]} only"),
        ({"pip": [f"p{i}" for i in range(300)]}, "at most 256"),
        ({"env_vars": {"A": 1}}, "maps names to texts"),
        ({"env_vars": {"ESCHER_TOKEN": "x"}}, "ESCHER_"),
        ({"working_dir": str(tmp_path / "missing")}, "is not one"),
        ({"excludes": []}, "takes env_vars, working_dir and pip"),
        ("env", "is a dict"),
    ]:
        with pytest.raises(escher.InvalidArgumentError) as refused:
            escher.remote(runtime_env=env)
        assert says in str(refused.value), (env, str(refused.value))
    with pytest.raises(escher.InvalidArgumentError, match="not supported yet"):
        env_of.options(runtime_env={"conda": "env.yaml"})


def test_pip_is_read_as_ray_writes_it(tmp_path):
    """A list, ``{"packages": [...]}`` or a requirements file: the same sorted set."""
    from escher import _api

    wanted = ["b==1", "a"]
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\nb==1  # a comment\n\na\na\n")
    for pip in (wanted, {"packages": wanted}, str(requirements)):
        assert _api._check_runtime_env({"pip": pip}) == {"pip": ["a", "b==1"]}, pip
