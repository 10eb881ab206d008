"""Runtime environments: environment variables and a working directory that a remote
function's calls run with (``runtime_env=`` on ``remote``, ``options`` and ``init``), put back
after each call so the next task of a warm interpreter starts as before, and that an actor
lives with (its own interpreter's, for its life); ``pip`` read as Ray writes it (test_processes.py installs a requirement on a worker process); what escher does not
do yet (``conda``) and bad values refused before anything is submitted."""

import os
import signal

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


def test_an_actor_lives_in_its_runtime_env(cluster, tmp_path):
    """An actor's ``env_vars`` and ``working_dir`` (on the class, or from ``options``) hold
    for its constructor and every call, on each of a threaded actor's threads, and through a
    restart; the class with its directory travels once per content hash; a class whose module
    imports a module of the working directory at its top loads; other actors and the next
    function tasks run without them."""
    (tmp_path / "actor_helpers_a43.py").write_text("def scale(x):\n    return 10 * x\n")
    (tmp_path / "data.txt").write_text("from the working dir\n")

    @escher.remote(max_concurrency=2, max_restarts=1,
                   runtime_env={"working_dir": str(tmp_path), "env_vars": {"A43_MODE": "fast"}})
    class Keeper:
        def __init__(self, base):
            import actor_helpers_a43

            self.base = actor_helpers_a43.scale(base)
            self.mode = os.environ.get("A43_MODE")
            self.cwd = os.getcwd()

        def seen(self):
            import actor_helpers_a43

            return (self.base, self.mode, os.environ.get("A43_MODE"),
                    open("data.txt").read().strip(), actor_helpers_a43.scale(1),
                    os.getcwd() == self.cwd)

        def pid(self):
            return os.getpid()

        def nap(self, seconds):
            import time

            time.sleep(seconds)

    (tmp_path / "big.bin").write_bytes(os.urandom(64 * 1024))  # the class travels once
    from escher import _actors

    stored = len(_actors._STORED)
    keeper, twin = Keeper.remote(4), Keeper.remote(4)
    assert len(_actors._STORED) == stored + 1
    want = (40, "fast", "fast", "from the working dir", 10, True)
    assert escher.get(twin.seen.remote(), timeout=60) == want
    escher.kill(twin)
    # Two calls at once, on two threads of the actor.
    assert escher.get([keeper.seen.remote(), keeper.seen.remote()], timeout=60) == [want] * 2
    from escher import _runtime_env

    digest = _runtime_env.pack(str(tmp_path))[1]
    # Restarted (its constructor run again): the environment holds in the next incarnation.
    pid = escher.get(keeper.pid.remote(), timeout=60)
    in_flight = keeper.nap.remote(60)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(escher.ActorDiedError, match="signal 9"):
        escher.get(in_flight, timeout=60)
    assert escher.get(keeper.seen.remote(), timeout=60) == want
    assert escher.get(keeper.pid.remote(), timeout=60) != pid
    other = Keeper.options(runtime_env={"env_vars": {"A43_MODE": "slow"}})
    with pytest.raises(escher.ActorDiedError, match="actor_helpers_a43"):
        # Its own runtime_env replaces the class's: no working directory, so no helpers.
        escher.get(other.remote(1).seen.remote(), timeout=60)

    @escher.remote
    class Plain:
        def where(self):
            return os.getcwd(), os.environ.get("A43_MODE")

    plain_cwd, plain_mode = escher.get(Plain.remote().where.remote(), timeout=60)
    assert plain_mode is None and digest not in plain_cwd
    assert escher.get([env_of.remote("A43_MODE") for _ in range(4)]) == [None] * 4
    escher.kill(keeper)

    # A class whose module imports a module of the working directory at its top: the class
    # is loaded once the directory is on the path.
    (tmp_path / "actor_module_a43.py").write_text(
        "import actor_helpers_a43\n\n"
        "class Scaler:\n"
        "    def scaled(self, x):\n"
        "        return actor_helpers_a43.scale(x)\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        import actor_module_a43
    finally:
        sys.path.remove(str(tmp_path))
    scaler = escher.remote(runtime_env={"working_dir": str(tmp_path)})(actor_module_a43.Scaler)
    assert escher.get(scaler.remote().scaled.remote(3), timeout=60) == 30


def test_init_gives_every_actor_its_runtime_env(tmp_path):
    import subprocess
    import sys

    (tmp_path / "init_helpers_a43.py").write_text("WHO = 'init'\n")
    code = (
        "import os, escher\n"
        f"escher.init(runtime_env={{'env_vars': {{'FROM_INIT': 'yes'}}, "
        f"'working_dir': {str(tmp_path)!r}}})\n"
        "@escher.remote\n"
        "class Reader:\n"
        "    def read(self):\n"
        "        import init_helpers_a43\n"
        "        return os.environ.get('FROM_INIT'), init_helpers_a43.WHO\n"
        "own = Reader.options(runtime_env={'env_vars': {'FROM_INIT': 'own'}})\n"
        "print(*Reader.remote().read.remote().result(timeout=60))\n"
        "try:\n"
        "    own.remote().read.remote().result(timeout=60)\n"
        "except ImportError as e:\n"
        "    print('own has no working dir:', 'init_helpers_a43' in str(e))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["yes init", "own has no working dir: True"], done.stdout


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

    # An actor's runtime_env is checked as a function's, at decoration and in options.
    class Box:
        def get(self):
            return 1

    for env, says in [
        ({"conda": "env.yaml"}, "not supported yet"),
        ({"env_vars": {"ESCHER_TOKEN": "x"}}, "ESCHER_"),
        ({"working_dir": str(tmp_path / "missing")}, "is not one"),
        ({"pip": ["--index-url=https://example.org"]}, "an option of pip"),
    ]:
        with pytest.raises(escher.InvalidArgumentError) as refused:
            escher.remote(runtime_env=env)(Box)
        assert says in str(refused.value), (env, str(refused.value))
        with pytest.raises(escher.InvalidArgumentError) as refused:
            escher.remote(Box).options(runtime_env=env)
        assert says in str(refused.value), (env, str(refused.value))


def test_pip_is_read_as_ray_writes_it(tmp_path):
    """A list, ``{"packages": [...]}`` or a requirements file: the same sorted set."""
    from escher import _api

    wanted = ["b==1", "a"]
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("# pinned\nb==1  # a comment\n\na\na\n")
    for pip in (wanted, {"packages": wanted}, str(requirements)):
        assert _api._check_runtime_env({"pip": pip}) == {"pip": ["a", "b==1"]}, pip
