// AudioWorklet for the demo page (static/demo.js): hears when an assistant reply starts
// playing. It runs on the audio rendering thread, on what the page plays (after the browser's
// jitter buffer and decoder), and checks every 128-sample render quantum: exact to ~3 ms,
// and never held back by a busy or throttled main thread.
//
// port in:  {turn}  arm for this reply (turn null: disarm)
// port out: {turn}  the first quantum louder than ONSET_DBFS since arming (then disarmed)

const ONSET_DBFS = -60; // between replies the gateway sends digital silence (decoded: below -100 dBFS)
const ONSET_RMS = 10 ** (ONSET_DBFS / 20);

registerProcessor("playout-onset", class extends AudioWorkletProcessor {
  constructor() {
    super();
    this.turn = null;
    this.port.onmessage = (event) => { this.turn = event.data.turn; };
  }

  process(inputs) {
    const samples = inputs[0] && inputs[0][0];
    if (this.turn !== null && samples && rms(samples) > ONSET_RMS) {
      this.port.postMessage({ turn: this.turn });
      this.turn = null;
    }
    return true;
  }
});

function rms(samples) {
  let sum = 0;
  for (const x of samples) sum += x * x;
  return Math.sqrt(sum / samples.length);
}
