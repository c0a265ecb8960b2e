"""bench.run's table: each measurement against its peer and its target, then the absolute figures behind them."""

from __future__ import annotations

from typing import Any

from bench import levers, student

TARGETS = {
    "train_vs_marian": 1.3,
    "bf16_vs_fp32": 1.5,
    "decode_vs_generate": 2.0,
    "ct2_vs_tfm": 1.5,
    "bleu_gap": 0.2,
    "int8_vs_ct2_int8": 1.0,
    "int8_bleu_drop": 0.5,
    "help_s": 1.0,
    "translate_s": 3.0,
    "rss_growth": 1.1,
    "members_vs_ensemble": 1.0,
    "student_vs_recipe": 2.5,
    "student_vs_ct2": 1.0,
}


def _met(ok: bool) -> str:
    return "yes" if ok else "NO"


def table(result: dict[str, Any]) -> str:
    """The human-readable summary: ratios first, then the absolute figures behind them."""
    t, lines = TARGETS, []
    add = lines.append
    add(f"{'measurement':<60} {'tfm':>10} {'peer':>10} {'ratio':>7} {'target':>8} {'met':>4}")
    for r in result.get("train", []):
        name = f"train {r['shape']} {r['precision']} tgt tok/s vs Marian"
        add(
            f"{name:<60} {r['tfm_tgt_tok_s']:>10,.0f} {r['marian_tgt_tok_s']:>10,.0f} {r['ratio_vs_marian']:>6.2f}x "
            f"{'>=' + str(t['train_vs_marian']):>8} {_met(r['ratio_vs_marian'] >= t['train_vs_marian']):>4}"
        )
        add(
            f"{'  src+tgt tok/s; MFU':<60} {r['tfm_all_tok_s']:>10,.0f} {r['marian_all_tok_s']:>10,.0f} "
            f"MFU {r['tfm_mfu']:.0%} vs {r['marian_mfu']:.0%}"
        )
        if "bf16_vs_fp32" in r:
            # The target holds where the processor supports bf16: here, where its bf16 matmuls beat its fp32 ones.
            peaks = result.get("peaks_gflops", {})
            fast = peaks.get("bf16", 0.0) > peaks.get("fp32", 0.0)
            add(
                f"{'  tfm bf16 vs tfm fp32':<60} {'':>10} {'':>10} {r['bf16_vs_fp32']:>6.2f}x "
                f"{'>=' + str(t['bf16_vs_fp32']):>8} "
                f"{_met(r['bf16_vs_fp32'] >= t['bf16_vs_fp32']) if fast else 'n/a':>4}"
            )
            if not fast:
                add(
                    f"{'    n/a: this processor computes bf16 no faster than fp32':<60} matmul peaks bf16 "
                    f"{peaks.get('bf16', 0):,.0f} vs fp32 {peaks.get('fp32', 0):,.0f} GFLOP/s"
                )
    for r in result.get("decode", []):
        if "agreement_alpha0" in r:
            a = r["agreement_alpha0"]
            gap = abs(a["tfm"]["bleu"] - a["ctranslate2"]["bleu"])
            add(
                f"{'same translation? beam 5, no length norm., BLEU':<60} {a['tfm']['bleu']:>10.2f} "
                f"{a['transformers']['bleu']:>10.2f} {a['ctranslate2']['bleu']:>7.2f} ct2 gap {gap:.2f} "
                f"{'(<=0.2 ' + _met(gap <= t['bleu_gap']) + ')'}"
            )
            add(
                f"{'  outputs identical to tfm: transformers, ctranslate2':<60} {'':>10} "
                f"{a['transformers']['identical_to_tfm']:>10.1%} {a['ctranslate2']['identical_to_tfm']:>7.1%}"
            )
            continue
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        ours = r["tfm"]
        for peer in ("transformers", "ctranslate2"):
            p = r[peer]
            name = f"decode {search} batch {r['batch']} sent/s vs {peer}"
            if peer == "transformers":
                target = t["decode_vs_generate"] if (r["beam"], r["batch"]) == (5, 32) else None
                ok = None if target is None else p["tfm_speedup"] >= target
                tgt = f">={target}" if target else ""
            else:
                ok, tgt = p["tfm_speedup"] >= 1 / t["ct2_vs_tfm"], f">={1 / t['ct2_vs_tfm']:.2f}"
            add(
                f"{name:<60} {ours['sentences_per_s']:>10.1f} {p['sentences_per_s']:>10.1f} {p['tfm_speedup']:>6.2f}x "
                f"{tgt:>8} {'' if ok is None else _met(ok):>4}"
            )
        add(
            f"{'  median of per-round ratios vs transformers / ctranslate2':<60} {'':>10} "
            f"{r['transformers']['tfm_speedup_median_round']:>9.2f}x "
            f"{r['ctranslate2']['tfm_speedup_median_round']:>6.2f}x"
        )
        add(
            f"{'  BLEU tfm / transformers / ctranslate2':<60} {ours['bleu']:>10.2f} {r['transformers']['bleu']:>10.2f} "
            f"{r['ctranslate2']['bleu']:>7.2f}"
        )
        add(
            f"{'  target tok/s tfm / transformers / ctranslate2':<60} {ours['tokens_per_s']:>10,.0f} "
            f"{r['transformers']['tokens_per_s']:>10,.0f} {r['ctranslate2']['tokens_per_s']:>7,.0f}"
        )
    if "int8" in result:
        for r in result["int8"]["grid"]:
            search, ours, p = "greedy" if r["beam"] == 1 else f"beam {r['beam']}", r["tfm"], r["ctranslate2"]
            name = f"int8 decode {search} batch {r['batch']} sent/s vs ctranslate2 int8"
            ok = p["tfm_speedup"] >= t["int8_vs_ct2_int8"]
            add(
                f"{name:<60} {ours['sentences_per_s']:>10.1f} {p['sentences_per_s']:>10.1f} {p['tfm_speedup']:>6.2f}x "
                f"{'>=' + str(t['int8_vs_ct2_int8']):>8} {_met(ok):>4}"
            )
        bleu = result["int8"]["bleu_all_lines"]
        for search, fp32 in bleu["fp32"].items():
            drop = fp32 - bleu["int8"][search]
            add(
                f"{'  tfm test BLEU fp32 / int8, ' + search:<60} {fp32:>10.2f} {bleu['int8'][search]:>10.2f} "
                f"{'':>7} {'drop<=' + str(t['int8_bleu_drop']):>8} {_met(drop <= t['int8_bleu_drop']):>4}"
            )
    s = result.get("startup_memory", {})
    if "help" in s:
        add(
            f"{'tfm --help wall s (CPU s); imports torch: ' + str(s['help_imports_torch']):<60} "
            f"{s['help']['wall_s']:>10.2f} {s['help']['cpu_s']:>10.2f} {'':>7} {'<1 s':>8} "
            f"{_met(s['help']['wall_s'] < t['help_s']):>4}"
        )
        label = 'tfm translate "..." wall s (CPU s)'
        add(
            f"{label:<60} {s['translate']['wall_s']:>10.2f} "
            f"{s['translate']['cpu_s']:>10.2f} {'':>7} {'<3 s':>8} "
            f"{_met(s['translate']['wall_s'] < t['translate_s']):>4}"
        )
    big = [k for k in s if k.startswith("rss_") and k != "rss_1000"]
    if "rss_1000" in s and big:
        small, large = s["rss_1000"]["peak_rss_mb"], s[big[0]]["peak_rss_mb"]
        add(
            f"{'peak RSS MB, 1,000 vs ' + big[0][4:] + ' lines (growth)':<60} {small:>10.0f} {large:>10.0f} "
            f"{large / small:>6.2f}x {'<=' + str(t['rss_growth']):>8} {_met(large / small <= t['rss_growth']):>4}"
        )
    for r in result.get("ensemble", []):
        search = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
        members = [v for k, v in r.items() if k.startswith("member ")]
        n = len(members)
        one_by_one = 1 / sum(1 / m["sentences_per_s"] for m in members)  # sentences/s running the members in turn
        name = f"ensemble of {n} {search} batch {r['batch']} sent/s vs members in turn"
        ratio, target = r["members_vs_ensemble"], t["members_vs_ensemble"]
        add(
            f"{name:<60} {r['tfm']['sentences_per_s']:>10.1f} {one_by_one:>10.1f} {ratio:>6.2f}x "
            f"{'>=' + str(target):>8} {_met(ratio >= target):>4}"
        )
        bleus = " ".join(f"{m['bleu']:.2f}" for m in members)
        add(f"{'  BLEU ensemble / members':<60} {r['tfm']['bleu']:>10.2f} {bleus}")
    if "student" in result:
        lines.extend(student.table_lines(result["student"], t))
    for r in result.get("levers", []):
        add(levers.row_line(r))
    return "\n".join(lines)
