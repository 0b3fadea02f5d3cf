"""Analysis of recorded runs: the metric definitions, merged results, report tables and figures, phases, divergence classification and the parity gate."""
