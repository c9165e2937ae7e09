/**
 * Frames read in this turn of the event loop, from sockets or as HTTP requests. Many in one turn
 * are a burst, and the socket I/O then writes what they cause in one write per socket; one alone
 * is not, and its answer leaves at once (see `Sockets.send`).
 */
export class Turn {
  frames = 0
  private readonly reset = () => {
    this.frames = 0
  }
  /** Counts a frame; the count starts again when the event loop next checks for I/O. */
  readonly count = () => {
    if (this.frames++ === 0) setImmediate(this.reset)
  }
}
