/** A Schema's JSON text form: encode to a string, decode from one without throwing. */
import * as Schema from "effect/Schema"

export const codec = <A, I>(schema: Schema.Schema<A, I>) => ({
  encode: Schema.encodeSync(Schema.parseJson(schema)),
  decode: Schema.decodeUnknownEither(Schema.parseJson(schema))
})
