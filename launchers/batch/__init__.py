"""What every batch scheduler's backend shares (Slurm here; PBS, LSF or Grid Engine are short
subclasses): the login side (:mod:`.backend`: write the job script, submit, follow the job's
console, cancel with the exit-code promise, ``status``/``down`` from the scheduler) and the in-job
side (:mod:`.job`: the first node coordinates, the others join it).

Not a backend itself: it exports no ``BACKEND``. Kept free of imports, because the registry
imports every folder here to find the backends."""
