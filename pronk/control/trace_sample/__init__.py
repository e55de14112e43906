"""A batch's trace sample, in one place: which traces a person sees and the per-trace table beside them (`choice`),
each sampled trace family as a DAG of step and tool nodes (`dag`), the nodes drawn as task runs in the batch's
finished flow run (`drawing`), the drawer process that does it off the flow run's path (`drawer`, run as
`python -m pronk.control.trace_sample.drawer`), and the lock that keeps one drawer a machine and lets `pronk stack
down` find it (`lock`).

`choice`, `dag` and `lock` import neither Prefect nor MLflow: the stack stops the drawer through `lock` alone.
"""
