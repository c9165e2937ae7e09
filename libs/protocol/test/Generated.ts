/**
 * Generated values for the fast-path tests, which check a hand-written decoder against its
 * Schema: records whose fields are drawn from pools of values near the wire types' boundaries.
 */

/** mulberry32: a fixed seed keeps any failure reproducible without a property-testing dependency. */
export const random = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

/** In a pool: the field is left out. */
export const absent = Symbol("absent")

/** One of `values`, drawn with `next`. */
export const pick = <A>(next: () => number, values: ReadonlyArray<A>): A => values[Math.floor(next() * values.length)] as A

/** A record with one draw from each field's pool (a field drawn `absent` is left out). */
export const record = (next: () => number, pools: Readonly<Record<string, ReadonlyArray<unknown>>>): Record<string, unknown> => {
  const value: Record<string, unknown> = {}
  for (const [key, pool] of Object.entries(pools)) {
    const v = pick(next, pool)
    if (v !== absent) value[key] = v
  }
  return value
}
