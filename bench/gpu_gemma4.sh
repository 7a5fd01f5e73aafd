#!/bin/bash
# gpu_gemma4.sh — the GPU Gemma 4 benchmark in one invocation: berth (CUDA backend) against Hugging Face
# transformers on a random-weight bf16 checkpoint with the real E2B shapes, next to the HBM bandwidth floor.
#
#   bench/gpu_gemma4.sh                                  (from anywhere; runs in the repository root)
#
# Steps (each timed; all output also goes to $OUT/gpu_gemma4.log, the summary to $OUT/gpu_gemma4.json):
#   gen    make the checkpoint (tools/gen_gemma4_bench_ckpt.py, torch on the GPU) unless $BENCH_CKPT holds one
#   bw     HBM bandwidth: median of 20 device-to-device copies of 2 GiB (bytes read + written, CUDA events), and
#          the bf16 matrix rate (8192^3, median of 10) for the prefill compute floor
#   berth  build/host/berth bench --config bench/gpu-bench.ini --concurrency 1,8,32,128 --prompt-len 512
#          --gen-len 128 --json, then TTFT: --concurrency 1,1,1,1,1 --prompt-len 2048 --gen-len 1 (five
#          sequential single requests; the median of their TTFTs is reported). Each level runs once unmeasured
#          with its own settings first (`berth bench --warmup each`, the default), as transformers is measured
#          after a warm-up with the same settings: the first steps of a new batch size record its decode graph
#   ncu    (only when named in PARTS) Nsight Compute kernel times of a TTFT prefill and of 1/8/32-sequence decode
#          steps, one line per forward pass in $OUT/ncu-*.txt, then the last pass per kernel (the CSVs, gzipped,
#          beside them: tools/ncu_forwards.py NAME.csv N shows pass N)
#   ktrace (only when named in PARTS) the in-graph kernel timeline of a decode step at 1 and 32 sequences
#          (bench/ktrace.c through CUDA_INJECTION64_PATH; bench/ktrace_summary.py), $OUT/ktrace-c*.txt
#   hf     bench/hf_gemma4_bench.py: TTFT(2048) at batch 1, then one process per batch size in $HF_BATCHES
#   then   one table: metric | berth | transformers | ratio (berth / transformers) | floor
#
# Floors: a decode step of batch B takes at least max((bytes read per step + B x KV bytes read at the mean decode
# context P + G/2) / bandwidth, B x 2 x (linear weights + LM head) / bf16 rate); the floor column is B over that.
# The header's batch-1 floor is the weights alone: bytes_read_per_decode_step of the generator (every weight but
# the per-layer-embedding table, the tied embedding once) / bandwidth. TTFT floor = prefill FLOPs (2 x P x linear
# weights + the LM head row + causal/sliding attention) / the measured bf16 rate.
#
# Environment: BUILD_DIR (default build; must hold host/berth and plugins/, prebuilt), PYTHON (default python3),
# BENCH_CKPT (default /tmp/berth-gemma4-$SHAPE), SHAPE (e2b | e4b, default e2b), HF_BATCHES (default "1 8 32 128";
# "" skips the transformers decode runs), HF_TTFT (1 = run the transformers TTFT, default 1), CONCURRENCY
# (default 1,8,32,128), PROMPT_LEN (512), GEN_LEN (128), TTFT_LEN (2048), PARTS (default "gen bw berth hf"),
# TIME_BUDGET (seconds for the whole script, default 540: transformers runs that would not fit are skipped and
# the table is still printed), BERTH_TIMEOUT (default 300 per berth run), HF_TIMEOUT (default 300 per process),
# OUT (default /tmp), COMMIT (the commit to name; default: git rev-parse), BERTH_CONFIG (instead of
# bench/gpu-bench.ini), HF_ARGS (extra options for hf_gemma4_bench.py). LD_LIBRARY_PATH is passed on as set.
# Exit status: 1 if a berth run failed (or berth is missing), else 0; transformers failures show in the table.
set -u

t_start=$(date +%s)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root" || exit 1
. bench/lib.sh # bench_config_nographs
build=${BUILD_DIR:-build}
py=${PYTHON:-python3}
shape=${SHAPE:-e2b}
ckpt=${BENCH_CKPT:-/tmp/berth-gemma4-$shape}
hf_batches=${HF_BATCHES-1 8 32 128}
hf_ttft=${HF_TTFT:-1}
conc=${CONCURRENCY:-1,8,32,128}
plen=${PROMPT_LEN:-512}
glen=${GEN_LEN:-128}
ttft_len=${TTFT_LEN:-2048}
parts=" ${PARTS:-gen bw berth hf} "
budget=${TIME_BUDGET:-540}
berth_timeout=${BERTH_TIMEOUT:-300}
hf_timeout=${HF_TIMEOUT:-300}
out=${OUT:-/tmp}
mkdir -p "$out"
log=$out/gpu_gemma4.log
summary=$out/gpu_gemma4.json
work=$(mktemp -d /tmp/gpu_gemma4.XXXXXX)
: >"$log"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

say() { echo "$*" | tee -a "$log"; }
elapsed() { echo $(($(date +%s) - t_start)); }
has() { case $parts in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
# Step timings for the summary: "name seconds" lines.
timing() { echo "$1 $2" >>"$work/timings"; }
# Append a step's stderr to the log; on failure also show its last lines.
report_err() {
    { echo "---- stderr of $1 ----"; cat "$2"; } >>"$log"
    if [ "$3" != 0 ]; then
        say "  $1 failed (exit $3); last lines of its stderr:"
        tail -n 8 "$2" | tee -a "$log"
    fi
}

# COMMIT wins when set: the lent GPU machine's copy of the tree may carry a stale .git (tools/gpu_run.sh sets it
# from the commit the carried build was made from).
commit=${COMMIT:-}
[ -z "$commit" ] && [ -s .devcarry/COMMIT ] && commit=$(cat .devcarry/COMMIT) # tools/gpu_prepare.sh wrote it
if [ -z "$commit" ]; then
    commit=$(git rev-parse --short HEAD 2>/dev/null || true)
    if [ -n "$commit" ]; then
        [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && commit="$commit+dirty"
    else
        commit=unknown
    fi
fi
say "gpu_gemma4: commit $commit, shape $shape, checkpoint $ckpt, build $build, parts:$parts"
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null)
say "gpu_gemma4: ${gpu%%$'\n'*}"
echo "commit $commit" >"$work/meta"

# ---- plan: byte counts (no torch needed) ------------------------------------------------------------------
if ! "$py" tools/gen_gemma4_bench_ckpt.py --shape "$shape" --out "$ckpt" --dry-run >"$work/plan.json" \
    2>"$work/plan.err"; then
    report_err plan "$work/plan.err" 1
    exit 1
fi

# ---- (a) checkpoint ---------------------------------------------------------------------------------------
if has gen; then
    t=$(date +%s)
    if [ -f "$ckpt/model.safetensors.index.json" ] && [ -f "$ckpt/config.json" ]; then
        say "gen: $ckpt already holds a checkpoint (index present); kept"
    else
        free=$(df -h --output=avail "$(dirname "$ckpt")" 2>/dev/null | tail -n 1 | tr -d ' ')
        say "gen: writing the $shape checkpoint to $ckpt ($free free)"
        "$py" tools/gen_gemma4_bench_ckpt.py --shape "$shape" --out "$ckpt" >"$work/gen.json" 2>"$work/gen.err"
        rc=$?
        report_err gen "$work/gen.err" $rc
        [ $rc = 0 ] || { say "gen: failed; nothing to benchmark"; exit 1; }
        tail -n 1 "$work/gen.err" | tee -a "$log"
    fi
    timing gen $(($(date +%s) - t))
fi
if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
    say "gpu_gemma4: no checkpoint at $ckpt (run with PARTS including gen)"
    exit 1
fi

# ---- (b) bandwidth and matrix rate ------------------------------------------------------------------------
if has bw; then
    t=$(date +%s)
    "$py" - >"$work/bw.json" 2>"$work/bw.err" <<'EOF'
import json, statistics, torch
dev = torch.device("cuda")
n = 2 << 30  # 2 GiB: far beyond the 60 MB L2
src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
def timed(fn, reps, warm):
    for _ in range(warm):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out), out
med, runs = timed(lambda: dst.copy_(src), 20, 3)
if not torch.equal(dst[:1 << 20], src[:1 << 20]):
    raise SystemExit("copy check failed")
del src, dst
m = 8192
x = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
y = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
gmed, _ = timed(lambda: x @ y, 10, 3)
print(json.dumps({"gpu": torch.cuda.get_device_name(dev), "copy_bytes": n, "copy_s": med,
                  "bandwidth_Bps": 2 * n / med, "copy_runs_s": runs, "gemm_n": m, "gemm_s": gmed,
                  "gemm_flops": 2 * m ** 3 / gmed}))
EOF
    rc=$?
    report_err bw "$work/bw.err" $rc
    [ $rc = 0 ] && say "bw: $("$py" -c 'import json, sys; d = json.load(open(sys.argv[1]))
print("%.0f GB/s device copy (read+write), bf16 GEMM %.0f TFLOP/s" % (d["bandwidth_Bps"] / 1e9, d["gemm_flops"] / 1e12))' \
        "$work/bw.json")"
    timing bw $(($(date +%s) - t))
fi

# ---- (d) berth ------------------------------------------------------------------------------------------------
berth_failed=0
if has berth; then
    t=$(date +%s)
    berth=$build/host/berth
    config=${BERTH_CONFIG:-bench/gpu-bench.ini}
    if [ -z "${BERTH_CONFIG:-}" ] && [ "$build" != build ]; then
        case $build in
            /*) plugdir=$build/plugins ;;
            *) plugdir=$root/$build/plugins ;;
        esac
        config=$work/gpu-bench.ini
        sed "s#^dir = ../build/plugins\$#dir = $plugdir#" bench/gpu-bench.ini >"$config"
        if ! grep -q "^dir = $plugdir\$" "$config"; then
            say "berth: bench/gpu-bench.ini has no 'dir = ../build/plugins' line"
            exit 1
        fi
    fi
    if [ ! -x "$berth" ]; then
        say "berth: $berth not found (BUILD_DIR=$build)"
        berth_failed=1
    else
        "$berth" plugins --config "$config" --model "$ckpt" >"$work/plugins.txt" 2>&1
        grep -E "^(model plugin|backend):" "$work/plugins.txt" | tee -a "$log"
        say "berth: bench --concurrency $conc --prompt-len $plen --gen-len $glen"
        timeout "$berth_timeout" "$berth" bench --config "$config" --model "$ckpt" --concurrency "$conc" \
            --prompt-len "$plen" --gen-len "$glen" --json >"$work/berth.jsonl" 2>"$work/berth.err"
        rc=$?
        report_err "berth bench" "$work/berth.err" $rc
        cat "$work/berth.jsonl" >>"$log"
        [ $rc = 0 ] || berth_failed=1
        timing berth_decode $(($(date +%s) - t))
        t=$(date +%s)
        say "berth: TTFT, 5 x (1 request, --prompt-len $ttft_len --gen-len 1)"
        timeout "$berth_timeout" "$berth" bench --config "$config" --model "$ckpt" --concurrency 1,1,1,1,1 \
            --prompt-len "$ttft_len" --gen-len 1 --json >"$work/berth_ttft.jsonl" 2>"$work/berth_ttft.err"
        rc=$?
        report_err "berth bench (TTFT)" "$work/berth_ttft.err" $rc
        cat "$work/berth_ttft.jsonl" >>"$log"
        [ $rc = 0 ] || berth_failed=1
        timing berth_ttft $(($(date +%s) - t))
    fi
fi

# ---- (d2) per-kernel breakdown (PARTS includes "ncu"; not in the default) -----------------------------------------
# Nsight Compute's kernel durations for a TTFT prefill and for decode steps at 1, 8 and 32 sequences after a
# prompt of PROMPT_LEN tokens (graphs off:
# ncu times kernels one by one, without overlap), summarised per forward pass by tools/ncu_forwards.py into
# $OUT/ncu-*.txt: what each figure above is limited by.
if has ncu && has berth && [ "$berth_failed" = 0 ]; then
    t=$(date +%s)
    ncu=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
    nog=$work/nograph.ini
    bench_config_nographs "$config" "$nog"
    # Decode steps at the benchmark's context (prompt $plen): attention cost grows with it.
    # (8 new tokens: the batch decodes a few steps all together after the last prefill; 'fullest' picks one)
    for job in "ttft:1:$ttft_len:1:last" "c1:1:$plen:3:last" "c8:8:$plen:8:fullest" "c32:32:$plen:8:fullest"; do
        IFS=: read -r name c p g pick <<<"$job"
        timeout "$berth_timeout" "$ncu" --metrics gpu__time_duration.sum --csv --print-units base \
            --cache-control none --clock-control none --log-file "$work/ncu-$name.csv" \
            "$berth" bench --config "$nog" --model "$ckpt" --concurrency "$c" --prompt-len "$p" --gen-len "$g" \
            >"$work/ncu-$name.out" 2>&1
        rc=$?
        [ $rc = 0 ] || say "ncu $name: exit $rc (see $work/ncu-$name.out)"
        "$py" tools/ncu_forwards.py "$work/ncu-$name.csv" "$pick" >"$out/ncu-$name.txt" 2>&1
        gzip -c "$work/ncu-$name.csv" >"$out/ncu-$name.csv.gz"
        say "ncu $name: $(head -n 1 "$out/ncu-$name.txt" | cut -c1-60) ... ($(grep -c '^forward' "$out/ncu-$name.txt") passes) -> $out/ncu-$name.txt"
    done
    timing ncu $(($(date +%s) - t))
fi

# ---- (d3) in-graph kernel timeline (PARTS includes "ktrace"; not in the default) ---------------------------------
# bench/ktrace.c (CUPTI, loaded through CUDA_INJECTION64_PATH) records every kernel of the graphed decode steps at
# 1 and 32 sequences with its real start and end (PDL overlap included, unlike ncu); bench/ktrace_summary.py prints
# one step's busy and exposed time per kernel kind into $OUT/ktrace-c*.txt.
if has ktrace && has berth && [ "$berth_failed" = 0 ]; then
    t=$(date +%s)
    case $build in /*) kt_lib=$build/bench/libberth_ktrace.so ;; *) kt_lib=$root/$build/bench/libberth_ktrace.so ;; esac
    if [ -f "$kt_lib" ]; then
        # the driver loads it by path; its libcupti is found through its runpath, else here
        kt_cupti=$(dirname "$(find /usr/local/cuda* -name 'libcupti.so*' 2>/dev/null | head -n 1)" 2>/dev/null)
        for c in 1 32; do
            CUDA_INJECTION64_PATH=$kt_lib KTRACE_OUT=$work/ktrace-c$c.csv \
                LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$kt_cupti" \
                timeout "$berth_timeout" "$berth" bench --config "$config" --model "$ckpt" --concurrency "$c" \
                --prompt-len "$plen" --gen-len "$glen" >"$work/ktrace-c$c.out" 2>&1 ||
                say "ktrace c=$c: exit $? (see $work/ktrace-c$c.out)"
            "$py" bench/ktrace_summary.py "$work/ktrace-c$c.csv" --top 40 >"$out/ktrace-c$c.txt" 2>&1
            gzip -c "$work/ktrace-c$c.csv" >"$out/ktrace-c$c.csv.gz" 2>/dev/null
            say "ktrace c=$c: $(head -n 1 "$out/ktrace-c$c.txt" | cut -c1-100) -> $out/ktrace-c$c.txt"
        done
    else
        say "ktrace: $kt_lib not built (CUPTI not found at configure time)"
    fi
    timing ktrace $(($(date +%s) - t))
fi

# ---- (e) transformers -----------------------------------------------------------------------------------------
# run_hf NAME ARGS...: one process, skipped when the time budget cannot hold it (60 s minimum).
run_hf() {
    local name=$1
    shift
    local left=$((budget - $(elapsed) - 20))
    if [ $left -lt 60 ]; then
        say "hf: $name skipped: $(elapsed) s of the $budget s budget used"
        echo '{"skipped": "time budget"}' >"$work/$name.json"
        return
    fi
    local lim=$hf_timeout
    [ "$left" -lt "$lim" ] && lim=$left
    local t
    t=$(date +%s)
    say "hf: $name ($*), limit $lim s"
    # shellcheck disable=SC2086 # HF_ARGS is a list of extra options
    timeout "$lim" "$py" bench/hf_gemma4_bench.py --model "$ckpt" "$@" ${HF_ARGS:-} >"$work/$name.json" \
        2>"$work/$name.err"
    local rc=$?
    report_err "hf $name" "$work/$name.err" $rc
    [ $rc = 0 ] || echo "{\"failed\": \"exit $rc\"}" >"$work/$name.json"
    [ $rc = 0 ] && grep "^hf_gemma4_bench: B=" "$work/$name.err" | tail -n 1 | tee -a "$log"
    timing "hf_$name" $(($(date +%s) - t))
}
if has hf; then
    [ "$hf_ttft" = 1 ] && run_hf ttft --prompt-len "$ttft_len" --ttft
    for b in $hf_batches; do
        run_hf "b$b" --batch "$b" --prompt-len "$plen" --gen-len "$glen"
    done
fi

# ---- (f) summary ------------------------------------------------------------------------------------------------
"$py" - "$work" "$summary" "$conc" "$plen" "$glen" "$ttft_len" "$berth_failed" <<'EOF' | tee -a "$log"
import json, os, statistics, sys
work, summary_path, conc, P, G, TP, berth_failed = sys.argv[1:8]
P, G, TP = int(P), int(G), int(TP)

def load(name):
    try:
        with open(os.path.join(work, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

def load_lines(name):
    try:
        with open(os.path.join(work, name)) as f:
            return [json.loads(l) for l in f if l.strip().startswith("{")]
    except (OSError, ValueError):
        return []

plan, bw = load("plan.json"), load("bw.json")
berth = {o["concurrency"]: o for o in load_lines("berth.jsonl")}
berth_ttft = [o["ttft_p50_s"] for o in load_lines("berth_ttft.jsonl")]
batches = [int(c) for c in conc.split(",")]
hf = {}
for fn in os.listdir(work):
    if fn.startswith("b") and fn.endswith(".json") and fn[1:-5].isdigit():
        hf[int(fn[1:-5])] = load(fn)
hf_ttft = load("ttft.json")
timings = {}
if os.path.exists(os.path.join(work, "timings")):
    for line in open(os.path.join(work, "timings")):
        k, v = line.split()
        timings[k] = int(v)
commit = open(os.path.join(work, "meta")).read().split()[1]

a = plan["arch"]
bw_Bps = bw["bandwidth_Bps"] if bw else None
rate = bw["gemm_flops"] if bw else None
step_bytes = plan["bytes_read_per_decode_step"]
ctx = P + G / 2  # mean context while decoding
kv_tok = min(ctx, a["sliding_window"]) * plan["kv_bytes_per_token_sliding_layers"] + ctx * plan["kv_bytes_per_token_full_layers"]

def decode_floor(b):
    """b tokens per step; a step can be no faster than its bytes over the bandwidth or its FLOPs over the rate."""
    if not bw_Bps:
        return None
    t_mem = (step_bytes + b * kv_tok) / bw_Bps
    t_flop = b * 2 * (plan["linear_params_per_token"] + a["vocab"] * a["hidden"]) / rate
    return b / max(t_mem, t_flop)

def prefill_flops(n):
    f = 2 * n * plan["linear_params_per_token"] + 2 * a["vocab"] * a["hidden"]
    W = a["sliding_window"]
    pairs_full = n * (n + 1) / 2
    pairs_sl = sum(min(p + 1, W) for p in range(n))
    nf, ns = a["full_layers"], a["layers"] - a["full_layers"]
    f += 4 * a["heads"] * (nf * a["head_dim_full"] * pairs_full + ns * a["head_dim_sliding"] * pairs_sl)
    return f

def hfval(d, key):
    if d is None:
        return None, "-"
    if "skipped" in d:
        return None, "skip"
    if "failed" in d:
        return None, "FAIL"
    v = d.get(key)
    return v, ("-" if v is None else None)

rows = []
def row(metric, bv, btxt, hv, htxt, floor, fmt):
    cell = lambda v, t: t if v is None else fmt % v
    ratio = "%.2fx" % (bv / hv) if bv is not None and hv else "-"
    rows.append((metric, cell(bv, btxt or "-"), cell(hv, htxt or "-"), ratio, cell(floor, "-")))

berth_txt = "FAIL" if berth_failed == "1" else "-"
batches = sorted(set(batches) | set(hf))
for b in batches:
    bo = berth.get(b)
    hv, ht = hfval(hf.get(b), "decode_tok_s")
    row(f"decode tok/s  B={b}", bo.get("decode_tok_s") if bo else None, berth_txt, hv, ht, decode_floor(b), "%.1f")
for b in batches:
    bo = berth.get(b)
    hv, ht = hfval(hf.get(b), "total_tok_s")
    row(f"total tok/s   B={b}", bo.get("tokens_per_s") if bo else None, berth_txt, hv, ht, None, "%.1f")
bt = statistics.median(berth_ttft) * 1e3 if berth_ttft else None
hv, ht = hfval(hf_ttft, "ttft_s")
row(f"TTFT ms  P={TP} B=1", bt, berth_txt, hv * 1e3 if hv is not None else None, ht,
    prefill_flops(TP) / rate * 1e3 if rate else None, "%.2f")

summary = {
    "commit": commit, "shape": plan["shape"], "checkpoint": plan["out"], "prompt_len": P, "gen_len": G,
    "ttft_prompt_len": TP, "gpu": bw["gpu"] if bw else None,
    "bandwidth_Bps": bw_Bps, "gemm_flops": rate, "bytes_read_per_decode_step": step_bytes,
    "floor_b1_ms": step_bytes / bw_Bps * 1e3 if bw_Bps else None,
    "floor_b1_tok_s": bw_Bps / step_bytes if bw_Bps else None,
    "kv_bytes_read_per_step_per_seq": kv_tok, "prefill_flops_ttft": prefill_flops(TP),
    "table": [dict(zip(("metric", "berth", "transformers", "ratio", "floor"), r)) for r in rows],
    "berth": list(berth.values()), "berth_ttft": load_lines("berth_ttft.jsonl"),
    "transformers": {str(k): v for k, v in sorted(hf.items())}, "transformers_ttft": hf_ttft,
    "bw": bw, "plan": plan, "timings_s": timings, "berth_failed": berth_failed == "1",
}
with open(summary_path, "w") as f:
    json.dump(summary, f, indent=1)

print()
print(f"== gpu_gemma4: commit {commit}, {summary['gpu'] or 'GPU ?'}, {plan['shape']} random bf16 "
      f"({plan['total_bytes'] / 1e9:.2f} GB), P={P} G={G} ==")
if bw_Bps:
    print(f"HBM copy {bw_Bps / 1e9:.0f} GB/s (read+write, 2 GiB, median of 20); bf16 GEMM {rate / 1e12:.0f} TFLOP/s")
    print(f"bytes read per decode step {step_bytes / 1e9:.3f} GB -> batch-1 floor {summary['floor_b1_ms']:.3f} ms "
          f"= {summary['floor_b1_tok_s']:.0f} tok/s")
else:
    print(f"bytes read per decode step {step_bytes / 1e9:.3f} GB (no bandwidth measured: no floor)")
hft = [v for k, v in sorted(hf.items()) if v and "warmup_s" in v]
if hft:
    note = {True: "", False: " (NOT compiled)", None: " (compiled: unknown)"}
    print("transformers: " + ", ".join(f"B={v['batch']} load {v['load_s']:.0f} s + warm-up/compile {v['warmup_s']:.0f} s"
                                        f"{note[v.get('compiled')]}" for v in hft))
w = [max(len(r[i]) for r in rows + [("metric", "berth", "transformers", "ratio", "floor")]) for i in range(5)]
fmt = "%-{}s  %{}s  %{}s  %{}s  %{}s".format(*w)
print(fmt % ("metric", "berth", "transformers", "ratio", "floor"))
for r in rows:
    print(fmt % r)
print("ratio = berth / transformers (TTFT: lower is better); floor: decode = B / max((weights + B x KV bytes) / "
      "bandwidth, B x matmul FLOPs / GEMM rate) per step; TTFT = prefill FLOPs / GEMM rate")
print("timings (s): " + ", ".join(f"{k} {v}" for k, v in timings.items()) + f"; summary {summary_path}")
EOF
say "gpu_gemma4: done in $(elapsed) s; log $log"
rm -rf "$work"
[ "$berth_failed" = 0 ] || exit 1
exit 0
