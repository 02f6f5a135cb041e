"""Print the task's TF_CONFIG and CUDA_VISIBLE_DEVICES as it received them, then exec the program.

Used in front of a real program (``report_env.py python -m tflaunch.models.mnist ...``) so a test can
compare what each task actually got with what the plan says, from the task's own log.
"""

import json
import os
import sys

print(f"REPORT_ENV TF_CONFIG={json.dumps(json.loads(os.environ['TF_CONFIG']), sort_keys=True)}")
print(f"REPORT_ENV CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}", flush=True)
os.execvp(sys.argv[1], sys.argv[1:])
