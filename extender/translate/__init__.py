"""Kubernetes objects read into the extender's typed state, once each: the pod translator.

`objects.py` turns a Pod or Node (a watched object, or one kube-scheduler posts in a verb's body)
into `PodInfo` / `NodeInventory` (extender/state.py), checking each tenant-written field on its
own (`shape.py`: the JSON's shape; `membership.py`: what a pod says of its gang; `taints.py`: taints
and tolerations). Pure functions over JSON: no API client, no HTTP. Both shells use it, the API
watch (extender/kube/) and the verbs (extender/http/), and neither imports the other.
"""
