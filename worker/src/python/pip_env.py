# Makes (once) the virtual environment of one pip requirement set for a worker's Python tasks
# (worker/src/python/pip_env.rs explains when). Run by the worker as the task's user, with the
# worker's interpreter: `python -c <this file> KEY REQUIREMENT...`. Prints the environment's
# interpreter on its last line of stdout; on failure, exits 2 with pip's (or venv's) own words
# on stderr.
#
# The environment lives under the user's home, in .escher/python-envs/KEY, KEY naming the
# requirement set and the interpreter. It is made under an exclusive lock on KEY.lock, so that
# two interpreters (of one worker or of two on the host) never make it twice; the last thing
# written is the marker `escher-ready`, so one left half-made by a killed build is made again.
# It sees the worker interpreter's own packages (cloudpickle) through a .pth file, after its
# own: what the requirements install comes first.
import fcntl
import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
import time


def run(args, what):
    done = subprocess.run(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, errors="replace")
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit status {done.returncode}):\n"
                           f"{done.stdout.strip()[-6000:]}")
    return done.stdout


def main():
    key, requirements = sys.argv[1], sys.argv[2:]
    home = os.environ.get("HOME") or tempfile.gettempdir()
    root = os.path.join(home, ".escher", "python-envs")
    os.makedirs(root, mode=0o700, exist_ok=True)
    venv = os.path.join(root, key)
    python = os.path.join(venv, "bin", "python")
    ready = os.path.join(venv, "escher-ready")
    with open(os.path.join(root, key + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(ready):
            shutil.rmtree(venv, ignore_errors=True)
            try:
                run([sys.executable, "-m", "venv", venv],
                    f"creating a virtual environment with {sys.executable} -m venv")
                own = [p for p in site.getsitepackages() if os.path.isdir(p)]
                user = site.getusersitepackages()
                if site.ENABLE_USER_SITE and os.path.isdir(user):
                    own.append(user)
                where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
                purelib = run([python, "-c", where],
                              "finding the environment's site-packages").strip().splitlines()[-1]
                with open(os.path.join(purelib, "_escher_worker.pth"), "w") as pth:
                    pth.write("".join(p + "\n" for p in own))
                run([python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                     "--quiet", *requirements],
                    "pip install " + " ".join(requirements))
            except RuntimeError as e:
                shutil.rmtree(venv, ignore_errors=True)
                print(e, file=sys.stderr)
                sys.exit(2)
            with open(ready + ".part", "w") as f:
                json.dump({"requirements": requirements, "made": time.time(),
                           "by": os.getpid()}, f)
            os.rename(ready + ".part", ready)
    print(python)


main()
