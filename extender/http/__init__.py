"""The HTTP shell: kube-scheduler's extender wire protocol in front of `extender.service`."""
