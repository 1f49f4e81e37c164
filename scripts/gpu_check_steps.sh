# The parts of scripts/gpu_check.sh that find
# the GPUs and the libraries, run one step, and write the report. Sourced by
# it, not run on its own: scripts/gpu_check.sh --help says how to run it.

passed_steps=0 failed_steps=0
step_names=() step_commands=() step_status=() step_seconds=() step_logs=() state_rows=()
# Made when needed; scripts/gpu_check.sh removes them when it exits.
step_log_dir="" nccl_link_dir=""
remove_temporary_folders() { rm -rf "${step_log_dir:-/nonexistent}" "${nccl_link_dir:-/nonexistent}"; }

# How many GPUs this process may use: what `nvidia-smi -L` lists, at most as
# many as a non-empty CUDA_VISIBLE_DEVICES names, none when it is set empty.
count_gpus() {
    if [[ -v CUDA_VISIBLE_DEVICES && -z $CUDA_VISIBLE_DEVICES ]]; then
        echo 0
        return
    fi
    local listed visible
    listed=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
    if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        visible=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
        ((visible < listed)) && listed=$visible
    fi
    echo "${listed:-0}"
}

# Why count_gpus found none, in words.
why_no_gpu() {
    if [[ -v CUDA_VISIBLE_DEVICES && -z $CUDA_VISIBLE_DEVICES ]]; then
        echo "CUDA_VISIBLE_DEVICES is set and empty"
    elif ! command -v nvidia-smi >/dev/null; then
        local device="no /dev/nvidia0"
        [[ -e /dev/nvidia0 ]] && device="/dev/nvidia0 exists, but the driver's tools are missing"
        echo "no nvidia-smi, $device"
    else
        echo "nvidia-smi -L lists no GPU"
    fi
}

# Points the binaries at libtorch and NCCL as PyTorch `$1` installed them:
# its torch/lib, and a folder with the `libnccl.so` link that cudarc opens.
use_pythons_libraries() {
    local found
    mapfile -t found < <("$1" - <<'EOF'
import importlib.util, os, torch
print(os.path.join(os.path.dirname(torch.__file__), "lib"))
spec = importlib.util.find_spec("nvidia.nccl")
print(os.path.join(list(spec.submodule_search_locations)[0], "lib") if spec else "")
EOF
    )
    [[ ${#found[@]} -eq 2 && -f ${found[1]}/libnccl.so.2 ]] || return 1
    nccl_link_dir=$(mktemp -d)
    ln -s "${found[1]}/libnccl.so.2" "$nccl_link_dir/libnccl.so"
    export LD_LIBRARY_PATH="${found[0]}:$nccl_link_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

# A file-name form of a GPU's name: "NVIDIA H100 80GB HBM3" -> nvidia-h100-80gb-hbm3.
slug() {
    tr '[:upper:]' '[:lower:]' <<<"$1" | sed 's/[^a-z0-9]\{1,\}/-/g; s/^-//; s/-$//'
}

# run_step NAME COMMAND...: runs it under --timeout, keeps its output and
# how it ended for the report.
run_step() {
    [[ -n $step_log_dir ]] || step_log_dir=$(mktemp -d)
    local name=$1 log="$step_log_dir/${#step_names[@]}.log" started status
    shift
    echo "gpu_check: $name: $*" >&2
    started=$(date +%s)
    timeout --kill-after=30 "$step_timeout" "$@" >"$log" 2>&1
    status=$?
    ((status == 0)) && passed_steps=$((passed_steps + 1)) || failed_steps=$((failed_steps + 1))
    ((status == 124 || status == 137)) && echo "(stopped after --timeout $step_timeout s)" >>"$log"
    step_names+=("$name") step_commands+=("$*") step_status+=("$status")
    step_seconds+=($(($(date +%s) - started))) step_logs+=("$log")
}

# The log of the step whose name starts with $1 (empty when none ran).
log_of() {
    local i
    for i in "${!step_names[@]}"; do
        [[ ${step_names[$i]} == "$1"* ]] && echo "${step_logs[$i]}" && return
    done
}

# same_state LABEL STEP_A STEP_B: whether two training steps ended in the
# same state (the fingerprint each prints: weights, optimizer state,
# progress); a difference, or a run that printed none, counts as a failed step.
same_state() {
    local a b verdict
    a=$(sed -n 's/.*fingerprint \(0x[0-9a-f]*\).*/\1/p' "$(log_of "$2")" 2>/dev/null)
    b=$(sed -n 's/.*fingerprint \(0x[0-9a-f]*\).*/\1/p' "$(log_of "$3")" 2>/dev/null)
    if [[ -n $a && $a == "$b" ]]; then
        verdict="equal" passed_steps=$((passed_steps + 1))
    else
        verdict="**DIFFER**" failed_steps=$((failed_steps + 1))
    fi
    echo "gpu_check: same final state, $1: $verdict" >&2
    state_rows+=("| $1 | ${a:-none} | ${b:-none} | $verdict |")
}

# write_report FILE GPUS LOAD_BEFORE MANIFEST PYTHON TORCH INVOCATION
write_report() {
    local out=$1 gpus=$2 load_before=$3 manifest=$4 python=$5 torch=$6 invocation=$7 i log
    local smi=(nvidia-smi --format=csv,noheader)
    {
        echo "# GPU check: $gpus x $("${smi[@]}" --query-gpu=name | head -1), $(date -u +%Y-%m-%d)"
        echo
        echo "Written by \`scripts/gpu_check.sh${invocation:+ $invocation}\` at $(date -u '+%Y-%m-%d %H:%M UTC')."
        echo "$passed_steps of $((passed_steps + failed_steps)) steps passed (the last two compare final states)."
        echo
        echo "| | |"
        echo "| --- | --- |"
        echo "| GPUs | $("${smi[@]}" --query-gpu=index,name,memory.total | paste -sd ';' | sed 's/;/; /g') |"
        echo "| driver | $("${smi[@]}" --query-gpu=driver_version | head -1), CUDA $(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1) |"
        echo "| PyTorch | $torch ($python) |"
        echo "| NCCL | $(sed -n 's/^NCCL \([0-9.]*\),.*/\1/p' "$(log_of "NCCL all_reduce")" | head -1) |"
        echo "| CPU | $(nproc) cores, $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1) |"
        echo "| binaries | $(paste -sd ';' "$manifest" | sed 's/;/; /g') |"
        echo "| load average (1, 5, 15 min) | before $load_before; after $(cut -d' ' -f1-3 /proc/loadavg) |"
        echo
        echo "## Steps"
        echo
        echo "| step | result | time | command |"
        echo "| --- | --- | ---: | --- |"
        for i in "${!step_names[@]}"; do
            local result="passed"
            ((step_status[i] == 0)) || result="**FAILED** (exit ${step_status[i]})"
            echo "| ${step_names[$i]} | $result | ${step_seconds[$i]} s | \`${step_commands[$i]}\` |"
        done
        echo
        echo "## GPU tests"
        echo
        for name in "GPU tests: the NCCL" "GPU tests: 2 and 3"; do
            log=$(log_of "$name")
            [[ -n $log ]] || continue
            echo '```text'
            grep -E '^test .* \.\.\. |^test result:' "$log"
            echo '```'
            echo
        done
        echo "## NCCL all_reduce (bench_nccl)"
        echo
        grep -E '^(NCCL |\|)' "$(log_of "NCCL all_reduce")"
        echo
        echo "## Tokens per second: the workbook's run and PyTorch's DDP on the same work"
        echo
        echo "The same tiny GPT, sorting task, micro-batches and AdamW on both sides: the defaults of"
        echo "scripts/bench_torch_ddp.py are the run's. The workbook's rate is over its whole run, PyTorch's"
        echo "over the steps its script times (its --help says which), of the steps shown."
        echo "Each training run's own words for its work:"
        echo
        echo '```text'
        for i in "${!step_names[@]}"; do
            [[ ${step_names[$i]} == training* ]] || continue
            echo "${step_names[$i]}: $(grep -m1 '^tiny GPT' "${step_logs[$i]}" || echo "(did not start)")"
        done
        echo '```'
        echo
        ((gpus > 1)) || echo "With one GPU the run on every GPU is the 1-GPU run, so it is not repeated."
        echo
        echo "| run | steps | tokens/s | held-out accuracy | replicas |"
        echo "| --- | ---: | ---: | --- | --- |"
        for i in "${!step_names[@]}"; do
            log=${step_logs[$i]}
            case "${step_names[$i]}" in
                training*)
                    echo "| ${step_names[$i]} | $(sed -n 's/^\([0-9]*\) steps in .*/\1/p' "$log") |" \
                        "$(sed -n 's/.* rank(s): \([0-9]*\) tokens\/s.*/\1/p' "$log") |" \
                        "$(grep -E '^(PASS|FAIL)' "$log" | sed 's/ in [0-9]* steps.*//') |" \
                        "$(grep -q '^replicas: bitwise equal' "$log" && echo "bitwise equal")$(sed -n 's/.*\(fingerprint 0x[0-9a-f]*\).*/, \1/p' "$log") |" ;;
                PyTorch*)
                    echo "| ${step_names[$i]} | $(sed -n 's/.*--steps \([0-9]*\).*/\1/p' <<<"${step_commands[$i]}") |" \
                        "$(sed -n 's/^tokens_per_second \([0-9.]*\)/\1/p' "$log") | | |" ;;
            esac
        done
        echo
        echo "## Same final state"
        echo
        echo "Runs that must end bitwise alike, by the fingerprint each prints (each counts as one step in the tally at the top)."
        echo
        echo "| runs | fingerprint | fingerprint | |"
        echo "| --- | --- | --- | --- |"
        printf '%s\n' "${state_rows[@]}"
        echo
        echo "## Each step's output (its last 60 lines)"
        for i in "${!step_names[@]}"; do
            echo
            echo "<details><summary>${step_names[$i]} (exit ${step_status[$i]})</summary>"
            echo
            echo '```text'
            tail -n 60 "${step_logs[$i]}"
            echo '```'
            echo
            echo "</details>"
        done
    } >"$out"
}
