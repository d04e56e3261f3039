"""The tools built on the public ops: bench, demo, the EP cost model, layout plots."""
