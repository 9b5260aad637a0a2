"""The network layer of a home: every channel between its processes, and nothing of what they compute.

- :mod:`.door`: every port a home listens on, one accept path (handshakes
  on threads of their own, each with a deadline, bounded in number overall
  and per source address; accepting survives running out of files);
- :mod:`.auth`: every connection proves the home's secret (mutual HMAC
  challenge-response bound to the channel's purpose), then continues on a
  :mod:`.sealed` channel (AES-256-GCM records under keys of that connection);
  :mod:`.preauth`: what a peer says before that, read by a deadline and
  parsed within bounds (size, nesting, numbers, types);
- :mod:`.wire`: JSON headers plus raw array bytes on a channel (never pickle);
  :mod:`.framing`: the one routine every frame is read with; :mod:`.schema`:
  typed messages (one dataclass each), validated on receipt;
- :mod:`.mesh`, :mod:`.links`: the data plane (each pipeline epoch's tensor
  links, tagged tensors, ring all-reduce); :mod:`.pacing`: a link's token
  bucket;
- :mod:`.heartbeat`, :mod:`.liveness`: a heartbeat channel per device, and
  when silence makes a device failed;
- :mod:`.netns`: real, kernel-shaped links (network namespaces, ``tc tbf``);
- :mod:`.errors`: :class:`~.errors.AuthenticationFailed` and
  :class:`~.errors.ChannelClosed`.

It imports nothing of the pipeline: the runtime (:mod:`ecofl.pipeline.runtime`)
and the deployment (:mod:`ecofl.deploy`) build on it.
"""
