#!/usr/bin/env bash
# The checks that need a CUDA GPU, as steps that fit the lent machine's 10-minute calls.
#
# Here (once, with the package registries):  benchmarks/gpu_checks.sh fetch
#   downloads into .whl/ (ignored by git) the wheels the GPU image lacks (it has torch,
#   numpy, pyyaml, tensorboard, matplotlib, imageio, pytest, but no gymnasium/pettingzoo/mpe2).
# There (the device tool, carrying .whl):     benchmarks/gpu_checks.sh run STEP...
#   STEP: tests (every CUDA test), envs (batched MPE throughput), train (MAPPO's training
#   throughput at large num_envs), mappo (MAPPO to -11.5 against the wall clock),
#   maddpg (MADDPG to -9.8 within 5 minutes). Each writes $OUT/<step>.log.
set -euo pipefail
cd "$(dirname "$0")/.."

wheels() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl \
        gymnasium==1.4.0 pettingzoo==1.27.0 mpe2==1.1.1 farama-notifications pygame-ce
}

install() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SCRATCH/site" .whl/*.whl
    export PYTHONPATH="$PWD/src:$SCRATCH/site" PYTHONUNBUFFERED=1
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; \
print(torch.__version__, torch.cuda.get_device_name(0))"
}

CUDA_TESTS=(
    tests/vector/test_device_steps.py tests/training/test_rollout_device.py
    tests/vector/test_native_vector.py tests/envs/test_mdp_batched.py
    tests/envs/test_tag_batched.py tests/arrays/test_streams.py
    tests/checks/test_batched_checker.py tests/data/test_replay.py
    tests/training/test_replay_learning.py tests/data/test_replay_rows.py
    tests/algos/test_policy_learner.py tests/algos/test_mappo.py
)

step() {
    local out="${OUT:-$SCRATCH}/$1.log"
    case "$1" in
        tests) python3 -m pytest -q -rs -p no:cacheprovider -k cuda "${CUDA_TESTS[@]}" \
            tests/envs/mpe/ ;;
        envs) python3 benchmarks/batched_mpe.py --device cuda --peers ;;
        train) python3 benchmarks/train_throughput.py --device cuda --algos mappo \
            --num-envs 4096 --steps 2000000 ;;
        mappo) python3 benchmarks/learn_wallclock.py --seeds 0 1 2 --seconds 60 \
            --target -11.5 --out "$SCRATCH/wallclock" --set device=cuda num_envs=4096 ;;
        maddpg) python3 benchmarks/learn_spread.py maddpg --seeds 0 --jobs 1 \
            --out "$SCRATCH/maddpg" --set device=cuda num_envs=1024 ;;
        *) echo "unknown step $1"; return 2 ;;
    esac 2>&1 | tee "$out"
}

case "${1:-}" in
    fetch) wheels ;;
    run) shift; SCRATCH="$(mktemp -d)"; install; for s in "$@"; do step "$s"; done ;;
    *) sed -n '2,10p' "$0"; exit 2 ;;
esac
