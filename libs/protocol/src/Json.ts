/**
 * JSON at the boundary: a Schema's text form, and the one bounded parse that every frame from a
 * client goes through. JSON.parse itself copes with any depth, but what comes after it (Schema
 * decoders, JSON.stringify, spreads) recurses, so a frame nested thousands deep would overflow the
 * stack far from where it came in. It is refused before parsing instead.
 */
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"

export const codec = <A, I>(schema: Schema.Schema<A, I>) => ({
  encode: Schema.encodeSync(Schema.parseJson(schema)),
  decode: Schema.decodeUnknownEither(Schema.parseJson(schema))
})

/** Whether two values write the same JSON text (key order included): a cheap "nothing changed". */
export const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b)

/** The deepest nesting of objects and arrays any protocol here accepts. */
export const MAX_DEPTH = 64

/**
 * Whether JSON text nests objects and arrays deeper than `max`, found by one scan of the text
 * (brackets inside strings don't count). Text shorter than `max` cannot, and is not scanned.
 */
export const tooDeep = (text: string, max = MAX_DEPTH): boolean => {
  if (text.length <= max) return false
  let depth = 0
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 34 /* " */) {
      for (i++; i < text.length; i++) {
        const d = text.charCodeAt(i)
        if (d === 92 /* \ */) i++
        else if (d === 34) break
      }
    } else if (c === 123 /* { */ || c === 91 /* [ */) {
      if (++depth > max) return true
    } else if (c === 125 /* } */ || c === 93 /* ] */) {
      depth--
    }
  }
  return false
}

/** The message `parse` gives for text nested too deep. */
export const tooDeepMessage = (max = MAX_DEPTH) => `JSON nested deeper than ${max} levels`

/** Parses untrusted JSON text, refusing nesting deeper than `max`; the error is a readable reason. */
export const parse = (text: string, max = MAX_DEPTH): Either.Either<unknown, string> => {
  if (tooDeep(text, max)) return Either.left(tooDeepMessage(max))
  try {
    return Either.right(JSON.parse(text))
  } catch (e) {
    return Either.left(e instanceof Error ? e.message : "invalid JSON")
  }
}

/**
 * For a hand-written decoder of parsed JSON (a twin of a Schema's, as `Edge.decodeOpenEventFast`):
 * copies an optional field onto `out` when it is present and `is` of its type; false when it is
 * present and is not, for the decoder to leave the value to its Schema.
 */
export const optionalField = <O, K extends keyof O>(out: O, key: K, value: unknown, is: (u: unknown) => u is O[K]): boolean => {
  if (value === undefined) return true
  if (!is(value)) return false
  out[key] = value
  return true
}
