"""Plausible one-line slips in --batch-invariant: its kernels (model/invariant.py), its layouts and where the
engine takes it up, beyond scripts/mutations.py."""
from mutation_entry import m

ENGINE = "jevany_daemon/engine/"
KERNELS = "jevany_daemon/model/invariant.py"
INVARIANT = "tests/engine/test_batch_invariant.py"
INVARIANT_KERNELS = "tests/model/test_invariant.py"
PARITY = INVARIANT + "::test_answers_stay_within_parity_of_the_default_kernels"

MUTATIONS = [
    # the kernels
    m("batch-invariant: a linear layer's bias left out", KERNELS,
      "    return y if self.bias is None else y + self.bias", "    return y", PARITY),
    m("batch-invariant: a product's last whole piece left out", KERNELS,
      "    for at in range(0, whole, PIECE_ROWS):", "    for at in range(0, whole - PIECE_ROWS, PIECE_ROWS):",
      INVARIANT_KERNELS),
    m("batch-invariant: a product's last rows computed in a piece of their own size", KERNELS,
      "        last = rows.new_zeros((PIECE_ROWS, k))", "        last = rows.new_zeros((m - whole, k))",
      INVARIANT_KERNELS),
    m("batch-invariant: a grid's run computed at the pass's width", KERNELS,
      "            yield x[at: at + rows, :, :width]", "            yield x[at: at + rows]", INVARIANT_KERNELS),
    m("batch-invariant: a flat run's rows taken one width apart", KERNELS,
      "            at += rows * width\n", "            at += width\n", INVARIANT_KERNELS),
    m("batch-invariant: a run's queries see later keys", KERNELS,
      "attn_mask=mask, is_causal=mask is None, scale=scale)", "attn_mask=mask, is_causal=False, scale=scale)",
      PARITY),
    m("batch-invariant: a flat pass's masks left out", KERNELS,
      "flat_runs, flat=True, masks=run_masks)", "flat_runs, flat=True)", PARITY),
    m("batch-invariant: attention's scores unscaled", KERNELS,
      "    columns = (query.float() * scale)", "    columns = (query.float())", INVARIANT_KERNELS),
    m("batch-invariant: a block's queries skipped one block too far", KERNELS,
      "slice(j * KEY_BLOCK, None)", "slice((j + 1) * KEY_BLOCK, None)", INVARIANT_KERNELS),
    m("batch-invariant: earlier blocks' sums not rescaled to a new peak", KERNELS,
      "        acc[:, :, seen] = acc[:, :, seen] * (peak[:, :, seen] - new).exp() + weighed",
      "        acc[:, :, seen] = acc[:, :, seen] + weighed", INVARIANT_KERNELS),
    # the layouts and the engine
    m("batch-invariant: rows' widths not rounded", ENGINE + "engine.py",
      'FlatLayout(round_width) if wanted == "auto" and packable else RowsLayout(round_width)',
      'FlatLayout(round_width) if wanted == "auto" and packable else RowsLayout()', INVARIANT),
    m("batch-invariant: a grid's reads left at their rows' places before sorting", ENGINE + "layouts.py",
      "                grid.read(placed[i], column)", "                grid.read(i, column)", INVARIANT),
    m("batch-invariant: a flat pass's requests not padded to their width", ENGINE + "layouts.py",
      "            pad = self.rounded(len(request_ids)) - len(request_ids)", "            pad = 0", INVARIANT),
    m("batch-invariant: a flat pass's masks cut one width apart", ENGINE + "layouts.py",
      "            masks.append(block_causal_mask(s.seg[0, at: at + rows * width].view(rows, width), dtype))\n"
      "            at += rows * width\n",
      "            masks.append(block_causal_mask(s.seg[0, at: at + rows * width].view(rows, width), dtype))\n"
      "            at += width\n", INVARIANT),
    m("batch-invariant: a packed request's branches not restarting after the prefix", ENGINE + "layouts.py",
      "        pos += range(p, p + len(b.tokens))", "        pos += range(len(pos), len(pos) + len(b.tokens))",
      "tests/engine/test_parity.py::test_shared_state_layouts_equal_rows"),     # packed passes lay requests out so too
    m("batch-invariant: a flat pass's runs read as a grid's", ENGINE + "layouts.py",
      "position_ids=s.pos, flat_runs=self.runs,", "position_ids=s.pos, grid_runs=self.runs,", INVARIANT),
    m("batch-invariant: a flat pass priced as if every request were as wide as the widest", ENGINE + "layouts.py",
      "        return Shape(1, tokens, stem=FLAT_ROW, tails=tokens)", "        return Shape(1, tokens)",
      INVARIANT + "::test_a_flat_pass_is_priced_at_the_padding_it_holds"),
    m("batch-invariant: label rows projected in one product", ENGINE + "readouts.py",
      "        readout.matmul = rows_matmul", "        pass", INVARIANT),
    m("batch-invariant: the prefix cache kept", ENGINE + "engine.py",
      "    if config.prefix_cache <= 0 or config.batch_invariant or model.model_type not in SHARED_PROVEN:",
      "    if config.prefix_cache <= 0 or model.model_type not in SHARED_PROVEN:",
      INVARIANT + "::test_the_prefix_cache_and_layout_settings_change_no_answer"),
    m("batch-invariant: the packed layout accepted", "jevany_daemon/config.py",
      '        if self.batch_invariant and self.layout not in ("auto", "rows"):',
      '        if self.batch_invariant and self.layout not in ("auto", "rows", "packed"):',
      INVARIANT + "::test_the_settings_refuse_what_cannot_be_invariant"),
    m("batch-invariant: the warm-up's check skipped", ENGINE + "warmup.py",
      "    if engine.config.batch_invariant and engine.config.max_batch_size > 1:",
      "    if engine.config.batch_invariant and engine.config.max_batch_size > 32:",
      INVARIANT + "::test_the_warm_up_checks_the_promise_on_this_host_and_refuses_to_serve_without_it"),
]
