"""Operator-level profiles (``--op-profile``): the engines' own profilers read into one schema
(``schemas.op_profile``). ``collect``: per engine; ``run``: one pass in this process; ``process``: a pass as a
process and what it prints (edge runs use it inside their box); ``job``: the pass of a served job, on the
job's cores after its load measurement."""
