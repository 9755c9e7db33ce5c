#!/usr/bin/env bash
# One GPU device call for the SSD prefill kernel: compile, test, profile and benchmark beside vLLM. Run from the
# repository root on the GPU machine, carrying .gpu (see /work/shared/gpu/README.md):
#
#     bash packages/mate-runtime/tests/gpu/run_ssd_session.sh [stage ...]
#
# Stages (default: all but ptxas, in this order; each under its own time limit, cut to what is left of $BUDGET
# (default 570 s, counted from before the setup), so the later ones still run and the results are packed before
# the device command's 600 s limit):
#     precompile  every SSD kernel of the tests and the benchmark, in parallel processes (limit $PRECOMPILE_S,
#                 default 240 s; $PRECOMPILE_ARGS:
#                 e.g. --defaults-only)
#     tests       tests/gpu/test_ssd_kernels.py, junit XML + log: the designs with the default settings
#                 (skipped under DEFAULT_TESTS=0), then on their own each group of $OPTION_TESTS (default all:
#                 settings = lean without overlap / preload, hpc8 = several heads per CTA, dt = the dt pre-pass
#                 at 1 and 8 heads per CTA, dtruns = the runs table inside the dt pre-pass and in the runs
#                 kernel, spc8 = several sequences per fused CTA (every design), prefetch = the lean kernel's
#                 L2 prefetch at one and at several sequences per CTA)
#     ptxas       registers / spills of the fused kernel (nvcc -Xptxas -v on TileLang's source)
#     profile     per-kernel device time of MATE and vLLM (tests/gpu/ssd_profile.py)
#     quick       mate bench ssd --quick (headline shape, two batches; lean with its defaults, with one
#                 sequence per CTA and no prefetch (mate-lean+spc1+noprefetch), with the sixth session's
#                 defaults (+nodtruns as well), with the opt-in MATE_SSD_HEADS_PER_CTA=8 when its tests passed
#                 (or the tests stage did not run); vLLM)
#     bench       mate bench ssd (the whole plan; writes after every shape; gets what is left of $BUDGET s)
#     sweep       (not in the default list) mate bench ssd --quick once per tile setting in $SWEEP
#                 ("threads:block_L[:overlap]", default "256:64 512:64 512:64:overlap"; MATE_SSD_THREADS /
#                 MATE_SSD_BLOCK_L / MATE_SSD_OVERLAP=1), each in its own process, designs $SWEEP_IMPLS (default
#                 mate-lean,vllm)
# Everything goes under $OUT (default ./ssd-session-out); only 8 files come back from the device machine, so
# the last step packs everything into $OUT/ssd-session.tgz.
OUT="${OUT:-$PWD/ssd-session-out}"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(precompile tests profile quick bench)
G=packages/mate-runtime/tests/gpu
# shellcheck source=session_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/session_common.sh"

for stage in "${stages[@]}"; do
    case "$stage" in
    precompile)
        stamp "precompile (jobs $JOBS)"
        timeout "$(stage_limit "${PRECOMPILE_S:-240}")" python3 $G/ssd_precompile.py --jobs "$JOBS" $PRECOMPILE_ARGS >"$OUT/precompile.log" 2>&1
        stamp "precompile rc=$? ($(grep -c '^precompiled' "$OUT/precompile.log") ok, $(grep -c FAILED "$OUT/precompile.log") failed)"
        ;;
    tests)
        # the measured designs first; then each opt-in option on its own (a fault or hang in one leaves the
        # others' results), and the quick benchmark takes only the options whose tests passed
        # ($DEFAULT_TESTS=0: only the options' tests)
        if [ "${DEFAULT_TESTS:-1}" != 0 ]; then
            stamp "tests"
            timeout "$(stage_limit "${TESTS_S:-240}")" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider \
                $G/test_ssd_kernels.py -k "not lean_setting and not heads_per_cta and not dt_heads and not runs_in_dt and not seqs_per_cta \
                and not prefetch" \
                --junitxml="$OUT/test_ssd_kernels.xml" >"$OUT/tests.log" 2>&1
            stamp "tests rc=$? $(tail -1 "$OUT/tests.log")"
        fi
        PASSED_OPTIONS=""
        # ($OPTION_TESTS: the names of the options whose tests run, default all)
        for opt in "settings:lean_setting" "hpc8:heads_per_cta and not dt_heads" "dt:dt_heads" "dtruns:runs_in_dt" \
            "spc8:seqs_per_cta" "prefetch:prefetch"; do
            IFS=: read -r name sel <<<"$opt"
            case " ${OPTION_TESTS:-settings hpc8 dt dtruns spc8 prefetch} " in *" $name "*) ;; *) continue ;; esac
            timeout "$(stage_limit 120)" python3 -m pytest -m gpu -q -rfE -p no:cacheprovider $G/test_ssd_kernels.py \
                -k "$sel" --junitxml="$OUT/test_ssd_$name.xml" >"$OUT/tests_$name.log" 2>&1
            rc=$?
            stamp "tests $name rc=$rc $(tail -1 "$OUT/tests_$name.log")"
            [ $rc -eq 0 ] && PASSED_OPTIONS="$PASSED_OPTIONS $name"
        done
        ;;
    ptxas)
        stamp "ptxas"
        timeout "$(stage_limit 90)" python3 $G/ssd_ptxas.py --out "$OUT/ptxas" >"$OUT/ptxas.log" 2>&1
        stamp "ptxas rc=$?"
        ;;
    profile)
        stamp "profile"
        timeout "$(stage_limit 180)" python3 $G/ssd_profile.py >"$OUT/profile.log" 2>&1
        stamp "profile rc=$?"
        ;;
    quick)
        # lean with its defaults, without the seventh session's sequences per CTA and prefetch, as before the
        # seventh session (the runs kernel too), with the opt-in option if its tests passed in this session (or
        # the tests stage did not run), vLLM
        impls=mate-lean,mate-lean+spc1+noprefetch,mate-lean+spc1+noprefetch+nodtruns
        for o in hpc8; do
            case " ${PASSED_OPTIONS- hpc8} " in *" $o "*) impls="$impls,mate-lean+$o" ;; esac
        done
        stamp "bench quick (${IMPLS:-$impls,vllm})"
        timeout "$(stage_limit 300)" python3 -m mate.bench.ssd --quick --impls "${IMPLS:-$impls,vllm}" --out "$OUT" --name ssd_quick >"$OUT/bench_quick.log" 2>&1
        stamp "bench quick rc=$?"
        ;;
    bench)
        left=$(budget_left)
        [ "$left" -lt 30 ] && { stamp "bench skipped: ${left}s left"; continue; }
        stamp "bench (${left}s)"
        timeout "$left" python3 -m mate.bench.ssd --impls "${IMPLS:-mate-lean,mate-lean+hpc8,vllm}" --out "$OUT" --name ssd >"$OUT/bench.log" 2>&1
        stamp "bench rc=$?"
        ;;
    sweep)
        for setting in ${SWEEP:-256:64 512:64 512:64:overlap}; do
            IFS=: read -r thr bl ovl <<<"$setting"
            tag="t${thr}_l${bl}${ovl:+_overlap}"
            [ "$ovl" = overlap ] && ovl=1 || ovl=0
            left=$(budget_left)
            [ "$left" -lt 60 ] && { stamp "sweep $setting skipped: ${left}s left"; continue; }
            stamp "sweep threads $thr block_L $bl"
            MATE_SSD_THREADS=$thr MATE_SSD_BLOCK_L=$bl MATE_SSD_OVERLAP=$ovl timeout $((left < 150 ? left : 150)) \
                python3 -m mate.bench.ssd --quick --impls "${SWEEP_IMPLS:-mate-lean,vllm}" \
                --out "$OUT" --name "ssd_sweep_$tag" >"$OUT/sweep_$tag.log" 2>&1
            stamp "sweep threads $thr block_L $bl rc=$?"
        done
        ;;
    *)
        stamp "unknown stage $stage"
        ;;
    esac
done
stamp "done"
tar czf "$OUT/ssd-session.tgz" -C "$OUT" --exclude ssd-session.tgz . 2>/dev/null
