package esfuse.esdev;

import java.lang.reflect.Field;
import java.lang.reflect.Modifier;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.IntPredicate;
import java.util.stream.Collectors;

/**
 * The character classes of the {@code token_chars} setting: {@code letter}, {@code digit},
 * {@code whitespace}, {@code punctuation}, {@code symbol}, {@code custom} (the characters of
 * {@code custom_token_chars}) and the Unicode general categories by their {@link Character}
 * constant name in lower case (e.g. {@code uppercase_letter}).
 */
final class TokenChars {

    private static final Set<Integer> PUNCTUATION = Set.of(
        (int) Character.START_PUNCTUATION,
        (int) Character.END_PUNCTUATION,
        (int) Character.OTHER_PUNCTUATION,
        (int) Character.CONNECTOR_PUNCTUATION,
        (int) Character.DASH_PUNCTUATION,
        (int) Character.INITIAL_QUOTE_PUNCTUATION,
        (int) Character.FINAL_QUOTE_PUNCTUATION
    );
    private static final Set<Integer> SYMBOL = Set.of(
        (int) Character.CURRENCY_SYMBOL,
        (int) Character.MATH_SYMBOL,
        (int) Character.OTHER_SYMBOL,
        (int) Character.MODIFIER_SYMBOL
    );

    private static final Map<String, IntPredicate> CLASSES = classes();

    private TokenChars() {}

    private static Map<String, IntPredicate> classes() {
        Map<String, IntPredicate> classes = new TreeMap<>();
        classes.put("letter", Character::isLetter);
        classes.put("digit", Character::isDigit);
        classes.put("whitespace", Character::isWhitespace);
        classes.put("punctuation", c -> PUNCTUATION.contains(Character.getType(c)));
        classes.put("symbol", c -> SYMBOL.contains(Character.getType(c)));
        for (Field field : Character.class.getFields()) {
            int mods = field.getModifiers();
            if (field.getType() == byte.class
                && Modifier.isStatic(mods)
                && Modifier.isPublic(mods)
                && field.getName().startsWith("DIRECTIONALITY") == false) {
                try {
                    byte category = field.getByte(null);
                    classes.put(field.getName().toLowerCase(Locale.ROOT), c -> Character.getType(c) == category);
                } catch (IllegalAccessException e) {
                    throw new AssertionError(e);
                }
            }
        }
        return Map.copyOf(classes);
    }

    /** The predicate for the listed classes, or null when the list is empty (keep every character). */
    static IntPredicate parse(List<String> names, String customChars) {
        if (names == null || names.isEmpty()) {
            return null;
        }
        IntPredicate result = c -> false;
        for (String raw : names) {
            String name = raw.toLowerCase(Locale.ROOT).trim();
            IntPredicate one = CLASSES.get(name);
            if (one == null && name.equals("custom")) {
                if (customChars == null) {
                    throw new IllegalArgumentException("Token type: 'custom' requires setting `custom_token_chars`");
                }
                Set<Integer> custom = customChars.codePoints().boxed().collect(Collectors.toSet());
                one = custom::contains;
            }
            if (one == null) {
                Set<String> known = new TreeSet<>(CLASSES.keySet());
                known.add("custom");
                throw new IllegalArgumentException("Unknown token type: '" + name + "', must be one of " + known);
            }
            result = result.or(one);
        }
        return result;
    }
}
