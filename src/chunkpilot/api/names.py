"""The API's names: group, version, kinds, plurals and the labels on owned objects.

Plain constants with no imports, so a client that only addresses the API (``kubectl
chunkpilot status``) needs neither pydantic nor the models.
"""

from __future__ import annotations

GROUP = "chunkpilot.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
ISVC_KIND = "InferenceService"
ISVC_PLURAL = "inferenceservices"
TRIAL_KIND = "TuningTrial"
TRIAL_PLURAL = "tuningtrials"

#: Labels the operator and tuner put on the objects they own.
LABEL_SERVICE = f"{GROUP}/service"
LABEL_TRACK = f"{GROUP}/track"
LABEL_CONFIG_HASH = f"{GROUP}/config-hash"
LABEL_TRIAL_NUMBER = f"{GROUP}/trial-number"
#: Engine pods of a disaggregated service: ``prefill`` or ``decode``.
LABEL_ROLE = f"{GROUP}/role"
#: Pods of a service that are not engines, e.g. ``router``.
LABEL_COMPONENT = f"{GROUP}/component"
