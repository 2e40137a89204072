package esfuse.esdev;

import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.ngram.NGramTokenizer;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.index.IndexSettings;
import org.elasticsearch.index.analysis.AbstractTokenizerFactory;

import java.util.function.IntPredicate;

/**
 * Lucene's {@link NGramTokenizer} configured like Elasticsearch's standard {@code ngram} tokenizer:
 * {@code min_gram} (default 1), {@code max_gram} (default 2), {@code token_chars} (empty: every
 * character belongs to a token) and {@code custom_token_chars}; {@code max_gram - min_gram} may not
 * exceed the index setting {@code index.max_ngram_diff} (default 1).
 */
final class NGramTokenizerFactory extends AbstractTokenizerFactory {

    private final int minGram;
    private final int maxGram;
    private final IntPredicate tokenChars; // null: keep all characters

    NGramTokenizerFactory(IndexSettings indexSettings, Environment environment, String name, Settings settings) {
        super(name);
        this.minGram = settings.getAsInt("min_gram", NGramTokenizer.DEFAULT_MIN_NGRAM_SIZE);
        this.maxGram = settings.getAsInt("max_gram", NGramTokenizer.DEFAULT_MAX_NGRAM_SIZE);
        int allowed = indexSettings.getMaxNgramDiff();
        int diff = maxGram - minGram;
        if (diff > allowed) {
            throw new IllegalArgumentException(
                "The difference between max_gram and min_gram in NGram Tokenizer must be less than or equal to: ["
                    + allowed
                    + "] but was ["
                    + diff
                    + "]. This limit can be set by changing the ["
                    + IndexSettings.MAX_NGRAM_DIFF_SETTING.getKey()
                    + "] index level setting."
            );
        }
        this.tokenChars = TokenChars.parse(settings.getAsList("token_chars"), settings.get("custom_token_chars"));
    }

    @Override
    public Tokenizer create() {
        if (tokenChars == null) {
            return new NGramTokenizer(minGram, maxGram);
        }
        IntPredicate accept = tokenChars;
        return new NGramTokenizer(minGram, maxGram) {
            @Override
            protected boolean isTokenChar(int chr) {
                return accept.test(chr);
            }
        };
    }
}
