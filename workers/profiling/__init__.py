"""Operator-level profiles (``--op-profile``): the engines' own profilers read into one schema
(``schemas.op_profile``). ``collect``: per engine; ``run``: one pass in this process; ``job``: the pass of a
served job, as a process on the job's cores after its load measurement."""
