// A WHIP publisher in the browser, for tests (tests/support/chromium.py serves it).
//
// Rules:
// - window.whip is the whole state the test reads: the offer and answer SDPs, the POST
//   status, Location and ETag, every connectionState and iceConnectionState the peer went
//   through (in order), the PATCHes sent (trickle), and the first error, if any.
// - whipPublish(endpoint, options) runs one publish: getUserMedia (the fake camera and
//   microphone Chromium is started with), one sendonly transceiver per track, codec
//   preferences restricted to options.videoCodec when given (options.simulcast: the video
//   is sent as three RID layers q, h, f at 1/4, 1/2 and full size), POST of the offer, the
//   answer applied. Without options.trickle the offer waits for ICE gathering to end (at
//   most options.gatherTimeoutMs) and carries every candidate; with it the offer is sent
//   at once and each later candidate goes out in its own PATCH (RFC 8840 fragment).
// - whipStop() DELETEs the session URL (when there is one) and closes the peer.
// - whipSelectedPair() reads the nominated candidate pair from getStats.
// - whipRestartIce() restarts ICE the WHIP way (RFC 9725 section 4.3.2): pc.restartIce(),
//   a new local offer (gathering awaited), a PATCH with If-Match: "*" carrying the new
//   ufrag, pwd and candidates of the bundle's first section; on 200 the previous answer
//   with the server's new ufrag and pwd is applied as the new remote answer (the server
//   keeps its sockets, so its candidates are the ones it answered first) and the new
//   ETag is kept. window.whip.restarts records each status.
// - whipSetLayerActive(rid, active) pauses or resumes one simulcast layer.
// - whipOutboundVideo() reads the sender's own view of its video from getStats: the
//   estimator's availableOutgoingBitrate, the encoder's targetBitrate, fps, frame size,
//   bytes sent, and the layers (outbound-rtp) it is sending.
"use strict";

window.whip = {
  offer: null,
  answer: null,
  status: null,
  location: null,
  etag: null,
  runId: null,
  connectionStates: [],
  iceConnectionStates: [],
  patches: [],
  restarts: [],
  error: null,
};

let whipPeer = null;
let whipEndpoint = null;

function whipFail(where, error) {
  if (window.whip.error === null) {
    window.whip.error = where + ": " + String(error);
  }
}

function whipWaitForGathering(pc, timeoutMs) {
  if (pc.iceGatheringState === "complete") {
    return Promise.resolve();
  }
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, timeoutMs);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") {
        clearTimeout(timer);
        resolve();
      }
    });
  });
}

function whipRestrictCodec(transceiver, mimeType) {
  const capabilities = RTCRtpSender.getCapabilities("video");
  const wanted = mimeType.toLowerCase();
  const chosen = capabilities.codecs.filter((c) => c.mimeType.toLowerCase() === wanted);
  if (chosen.length === 0) {
    throw new Error("this browser cannot send " + mimeType);
  }
  if (wanted === "video/h264") {
    // Prefer packetization-mode=1 (the server decodes only that one).
    chosen.sort((a, b) => {
      const ma = (a.sdpFmtpLine || "").includes("packetization-mode=1") ? 0 : 1;
      const mb = (b.sdpFmtpLine || "").includes("packetization-mode=1") ? 0 : 1;
      return ma - mb;
    });
  }
  transceiver.setCodecPreferences(chosen);
}

function whipFragment(candidate) {
  const sdp = whipPeer.localDescription.sdp;
  const ufrag = /a=ice-ufrag:(\S+)/.exec(sdp)[1];
  const pwd = /a=ice-pwd:(\S+)/.exec(sdp)[1];
  const lines = ["a=ice-ufrag:" + ufrag, "a=ice-pwd:" + pwd];
  if (candidate === null) {
    lines.push("a=end-of-candidates");
  } else {
    lines.push("m=audio 9 UDP/TLS/RTP/SAVPF 0", "a=mid:" + candidate.sdpMid);
    lines.push("a=" + candidate.candidate);
  }
  return lines.join("\r\n") + "\r\n";
}

async function whipPatch(candidate) {
  const response = await fetch(new URL(window.whip.location, whipEndpoint), {
    method: "PATCH",
    headers: {
      "Content-Type": "application/trickle-ice-sdpfrag",
      "If-Match": window.whip.etag || "*",
    },
    body: whipFragment(candidate),
  });
  window.whip.patches.push(response.status);
  const etag = response.headers.get("ETag");
  if (etag !== null) {
    window.whip.etag = etag;
  }
}

async function whipPublish(endpoint, options) {
  const opts = Object.assign(
    {
      videoCodec: null,
      audio: true,
      trickle: false,
      gatherTimeoutMs: 5000,
      token: null,
      width: 640,
      height: 360,
      simulcast: false,
    },
    options || {},
  );
  whipEndpoint = endpoint;
  try {
    const media = await navigator.mediaDevices.getUserMedia({
      video: { width: opts.width, height: opts.height, frameRate: 30 },
      audio: opts.audio,
    });
    const pc = new RTCPeerConnection({ iceServers: [] });
    whipPeer = pc;
    pc.addEventListener("connectionstatechange", () => {
      window.whip.connectionStates.push(pc.connectionState);
    });
    pc.addEventListener("iceconnectionstatechange", () => {
      window.whip.iceConnectionStates.push(pc.iceConnectionState);
    });
    const pending = [];
    if (opts.trickle) {
      pc.addEventListener("icecandidate", (event) => {
        const candidate = event.candidate && event.candidate.candidate ? event.candidate : null;
        if (window.whip.location === null) {
          pending.push(candidate);
        } else {
          whipPatch(candidate).catch((e) => whipFail("patch", e));
        }
      });
    }
    for (const track of media.getTracks()) {
      const init = { direction: "sendonly", streams: [media] };
      if (track.kind === "video" && opts.simulcast) {
        init.sendEncodings = [
          { rid: "q", scaleResolutionDownBy: 4 },
          { rid: "h", scaleResolutionDownBy: 2 },
          { rid: "f" },
        ];
      }
      const transceiver = pc.addTransceiver(track, init);
      if (track.kind === "video" && opts.videoCodec !== null) {
        whipRestrictCodec(transceiver, opts.videoCodec);
      }
    }
    await pc.setLocalDescription(await pc.createOffer());
    if (!opts.trickle) {
      await whipWaitForGathering(pc, opts.gatherTimeoutMs);
    }
    window.whip.offer = pc.localDescription.sdp;
    const headers = { "Content-Type": "application/sdp" };
    if (opts.token !== null) {
      headers.Authorization = "Bearer " + opts.token;
    }
    const response = await fetch(endpoint, {
      method: "POST",
      headers: headers,
      body: window.whip.offer,
    });
    window.whip.status = response.status;
    const answer = await response.text();
    if (response.status !== 201) {
      throw new Error("POST answered " + response.status + ": " + answer);
    }
    window.whip.location = response.headers.get("Location");
    window.whip.etag = response.headers.get("ETag");
    window.whip.runId = response.headers.get("X-Run-Id");
    window.whip.answer = answer;
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    for (const candidate of pending.splice(0)) {
      await whipPatch(candidate);
    }
    return window.whip.status;
  } catch (e) {
    whipFail("publish", e);
    throw e;
  }
}

function whipRestartFragment(sdp) {
  const lines = sdp.split(/\r?\n/).filter((line) => line.length > 0);
  const out = [
    "a=ice-ufrag:" + /a=ice-ufrag:(\S+)/.exec(sdp)[1],
    "a=ice-pwd:" + /a=ice-pwd:(\S+)/.exec(sdp)[1],
  ];
  const bundle = lines.find((line) => line.startsWith("a=group:BUNDLE"));
  if (bundle !== undefined) {
    out.push(bundle);
  }
  const start = lines.findIndex((line) => line.startsWith("m="));
  let end = lines.slice(start + 1).findIndex((line) => line.startsWith("m="));
  end = end === -1 ? lines.length : start + 1 + end;
  const section = lines.slice(start, end);
  out.push(section[0]);
  const mid = section.find((line) => line.startsWith("a=mid:"));
  if (mid !== undefined) {
    out.push(mid);
  }
  out.push(...section.filter((line) => line.startsWith("a=candidate:")));
  out.push("a=end-of-candidates");
  return out.join("\r\n") + "\r\n";
}

async function whipRestartIce() {
  try {
    const pc = whipPeer;
    // The gathering state may still read "complete" from the first generation right
    // after setLocalDescription: wait for this generation's end-of-candidates instead.
    const gathered = new Promise((resolve) => {
      const timer = setTimeout(resolve, 5000);
      pc.addEventListener("icecandidate", (event) => {
        if (event.candidate === null || !event.candidate.candidate) {
          clearTimeout(timer);
          resolve();
        }
      });
    });
    pc.restartIce();
    await pc.setLocalDescription(await pc.createOffer());
    await gathered;
    const response = await fetch(new URL(window.whip.location, whipEndpoint), {
      method: "PATCH",
      headers: { "Content-Type": "application/trickle-ice-sdpfrag", "If-Match": "*" },
      body: whipRestartFragment(pc.localDescription.sdp),
    });
    window.whip.restarts.push(response.status);
    const fragment = await response.text();
    if (response.status !== 200) {
      await pc.setLocalDescription({ type: "rollback" });
      return response.status;
    }
    const ufrag = /a=ice-ufrag:(\S+)/.exec(fragment)[1];
    const pwd = /a=ice-pwd:(\S+)/.exec(fragment)[1];
    const answer = window.whip.answer
      .replace(/a=ice-ufrag:\S+/g, "a=ice-ufrag:" + ufrag)
      .replace(/a=ice-pwd:\S+/g, "a=ice-pwd:" + pwd);
    window.whip.answer = answer;
    window.whip.etag = response.headers.get("ETag");
    await pc.setRemoteDescription({ type: "answer", sdp: answer });
    return response.status;
  } catch (e) {
    whipFail("restart", e);
    throw e;
  }
}

async function whipStop() {
  let status = null;
  if (window.whip.location !== null) {
    const response = await fetch(new URL(window.whip.location, whipEndpoint), {
      method: "DELETE",
    });
    status = response.status;
  }
  if (whipPeer !== null) {
    whipPeer.close();
  }
  return status;
}

async function whipSelectedPair() {
  if (whipPeer === null) {
    return null;
  }
  const stats = await whipPeer.getStats();
  let pair = null;
  stats.forEach((report) => {
    if (report.type === "transport" && report.selectedCandidatePairId) {
      pair = stats.get(report.selectedCandidatePairId);
    }
  });
  if (pair === null) {
    return null;
  }
  const local = stats.get(pair.localCandidateId);
  const remote = stats.get(pair.remoteCandidateId);
  const describe = (c) => ({
    protocol: c.protocol,
    candidateType: c.candidateType,
    address: c.address,
    port: c.port,
    tcpType: c.tcpType || null,
  });
  return {
    state: pair.state,
    nominated: pair.nominated,
    bytesSent: pair.bytesSent,
    local: describe(local),
    remote: describe(remote),
  };
}

// Pause or resume one simulcast layer of the video sender (RTCRtpSender.setParameters with
// the encoding's active flag): what Chromium does itself when bandwidth drops.
async function whipSetLayerActive(rid, active) {
  const sender = whipPeer.getSenders().find((s) => s.track && s.track.kind === "video");
  const parameters = sender.getParameters();
  const encoding = parameters.encodings.find((e) => e.rid === rid);
  encoding.active = active;
  await sender.setParameters(parameters);
  return parameters.encodings.map((e) => [e.rid, e.active]);
}

async function whipOutboundVideo() {
  if (whipPeer === null) {
    return null;
  }
  const stats = await whipPeer.getStats();
  let available = null;
  const layers = [];
  stats.forEach((report) => {
    if (report.type === "candidate-pair" && report.nominated && report.state === "succeeded") {
      available = report.availableOutgoingBitrate ?? null;
    }
    if (report.type === "outbound-rtp" && report.kind === "video") {
      layers.push({
        rid: report.rid || null,
        targetBitrate: report.targetBitrate ?? null,
        framesPerSecond: report.framesPerSecond ?? null,
        frameWidth: report.frameWidth ?? null,
        frameHeight: report.frameHeight ?? null,
        bytesSent: report.bytesSent,
        qualityLimitationReason: report.qualityLimitationReason || null,
      });
    }
  });
  return { availableOutgoingBitrate: available, layers: layers };
}
