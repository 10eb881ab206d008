#!/bin/sh
# escher on a real NVIDIA GPU, read-only: what the driver reports, what escher's worker discovers
# (and its MIG tables beside the driver's), and real tasks bound to the GPU through a head and a
# worker on loopback. Nothing here changes MIG mode, a MIG layout or any GPU setting.
#
#   scripts/real-gpu-check.sh [BIN_DIR] [OUT_DIR]
#
# BIN_DIR holds escher, escher-head and escher-worker (default target/release); the transcript
# goes to OUT_DIR/gpu-check.txt (default a new temporary folder), the head's and the worker's
# logs beside it. Exits non-zero when a step escher is responsible for fails.
set -u
BIN=$(cd "${1:-target/release}" && pwd)
OUT=${2:-$(mktemp -d)}
mkdir -p "$OUT"
PATH=$BIN:$PATH
export PATH
LOG=$OUT/gpu-check.txt
: >"$LOG"
status=0
step() { echo "== $*" >>"$LOG"; timeout 45 "$@" >>"$LOG" 2>&1 || { echo "(exit $?)" >>"$LOG"; return 1; }; }

# What the driver says, read-only.
step nvidia-smi
step nvidia-smi --query-gpu=name,uuid,memory.total,mig.mode.current,mig.mode.pending,driver_version --format=csv
step nvidia-smi mig -lgip
step nvidia-smi mig -lgipp
step nvidia-smi mig -lgi
# What escher's worker discovers, and its MIG tables against the driver's.
step escher-worker --detect || status=1

# A head and a worker on loopback, secure by default (the access file in a fresh ESCHER_HOME).
ESCHER_HOME=$(mktemp -d)
export ESCHER_HOME
escher-head >"$OUT/head.log" 2>&1 &
HEAD=$!
WORKER=
trap 'kill $WORKER $HEAD 2>/dev/null' EXIT
tries=0
until escher status >/dev/null 2>&1 || [ $tries -ge 100 ]; do
    [ -z "$WORKER" ] && [ -f "$ESCHER_HOME/access.json" ] && {
        escher-worker >"$OUT/worker.log" 2>&1 &
        WORKER=$!
    }
    tries=$((tries + 1))
    sleep 0.2
done
[ -z "$WORKER" ] && { escher-worker >"$OUT/worker.log" 2>&1 & WORKER=$!; }
sleep 2
step escher status || status=1
step escher gpus || status=1
# A task given the whole GPU sees exactly it; a task given none sees none.
step escher submit --resources gpu=1 --wait -- sh -c 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; nvidia-smi -L; python3 -c "import torch; x = torch.ones(1024, 1024, device=\"cuda\"); print(\"torch sees\", torch.cuda.device_count(), torch.cuda.get_device_name(0), \"sum\", float((x @ x).sum()))"' || status=1
step escher submit --resources cpu=1 --wait -- sh -c 'echo "CUDA_VISIBLE_DEVICES=[$CUDA_VISIBLE_DEVICES] NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"; python3 -c "import torch; print(\"torch sees\", torch.cuda.device_count())"' || status=1
# Half a GPU twice: both share the device and both run.
step escher submit --resources gpu=0.5 -- sh -c 'python3 -c "import torch, time; x = torch.ones(4096, 4096, device=\"cuda\"); [x @ x for _ in range(200)]; torch.cuda.synchronize(); print(\"half\", torch.cuda.get_device_name(0))"' || status=1
step escher submit --resources gpu=0.5 -- sh -c 'python3 -c "import torch, time; x = torch.ones(4096, 4096, device=\"cuda\"); [x @ x for _ in range(200)]; torch.cuda.synchronize(); print(\"half\", torch.cuda.get_device_name(0))"' || status=1
sleep 1
step escher top --once || status=1
step escher get 3 || status=1
step escher get 4 || status=1
step escher tasks || status=1
for t in 1 2 3 4; do step escher logs "$t" || status=1; done
kill "$WORKER" "$HEAD" 2>/dev/null
wait 2>/dev/null
echo "== exit $status" >>"$LOG"
cat "$LOG"
exit $status
